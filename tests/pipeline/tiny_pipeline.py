"""The tiny two-iteration pipeline config the end-to-end tests share, and the pair of runs
(the compiled graph under kfp.local, the in-process loop) that graph tests compare."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from sparring.pipelines.local import run_kfp

from sparring.loop.config import PipelineConfig
from sparring.loop.local import run_local
from sparring.loop.runner import run_loop


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


def graph_and_loop(cfg: PipelineConfig, tmp_path: Path):
    """`cfg` run twice: its compiled KFP graph under kfp.local (storage and tracking as
    configured; task folders under tmp_path/runs) and the in-process loop (storage under
    tmp_path/here, no tracking, work folders under tmp_path/work). Returns both results."""
    kfp = run_local(cfg, tmp_path / "runs", engine=run_kfp)
    here = cfg.model_copy(
        update={
            "run_name": "in-process",
            "storage": cfg.storage.model_copy(update={"root": str(tmp_path / "here")}),
            "tracking": cfg.tracking.model_copy(update={"enabled": False}),
        }
    )
    return kfp, run_loop(here, tmp_path / "work")


def played(folder: Path) -> list[tuple]:
    """A rollout folder's games: (game_id, seat policies, transcript, rewards) each."""
    rows = [json.loads(line) for line in (folder / "games.jsonl").read_text().splitlines()]
    return [(g["game_id"], g["seat_policies"], g["transcript"], g["rewards"]) for g in rows]
