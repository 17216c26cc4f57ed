"""The tiny two-iteration pipeline config the end-to-end tests share."""

from __future__ import annotations

import uuid

from sparring.loop.config import PipelineConfig


def tiny_config(tmp_path, model: str, s3_server=None) -> PipelineConfig:
    """The smallest pipeline that still runs every step: 2 states x 2 plays, 1 val game; with
    `s3_server`, its endpoint is in the config (as a pod needs it)."""
    tag = uuid.uuid4().hex[:6]
    storage = {"root": f"s3://sparring/e2e-{tag}"}
    if s3_server is not None:
        storage["endpoint_url"] = s3_server.endpoint_url
    return PipelineConfig.model_validate(
        {
            "run_name": f"e2e-{tag}",
            "game": {"params": {"k": 3, "max_turns": 2}},
            "model": model,
            "iterations": 2,
            "games_per_iteration": 4,
            "device": "cpu",
            "game_init": {"num_train": 4, "num_val": 1},
            "rollout": {"games_per_init": 2, "sampling": {"max_new_tokens": 8}},
            "eval": {"rollout": {"sampling": {"temperature": 0.0, "max_new_tokens": 8}}},
            "storage": storage,
            "tracking": {
                "tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}",
                "experiment": "e2e",
            },
            "registered_model": f"e2e-{tag}",
        }
    )
