"""Checkpoint bytes stored and moved per pipeline iteration, computed from a pipeline config and
its model's shape (no download, no GPU): before and after issue 34 passed checkpoints by reference.

    .venv/bin/python bench/checkpoint_bytes.py                       # configs/pipeline-gpu.yaml
    .venv/bin/python bench/checkpoint_bytes.py --config my.yaml

The model's parameters are counted on the meta device from its HF config fields (written down
below for the models the shipped configs name; tied embeddings are stored once, as
safetensors does). One steady-state iteration i >= 1 of the torch backend (rollout -> train ->
evaluate -> register, no shards, no past-<k> opponents), W = one checkpoint's weights in the
config's `train.param_dtype`, R = the reference (the initial model, hub dtype):

  before (KFP output artifacts: the launcher uploads a task's Output[Model] folder into the
  pipeline root and downloads it into every consumer; nothing ever deletes it):
    train-i writes `trained` (1 W up); rollout-i reads `model` (1 W down); train-i reads `model`
    and `reference` (1 W + R down, KL on or off); evaluate-i reads `trained` and `previous`
    (2 W down); register-i reads `trained` (1 W down) and uploads it once more into the
    registry (1 W up). Stored: 2 W (the pipeline root's and the registry's).
  after (sparring.loop.checkpoints: the artifact is a ~1 KB `checkpoint.json`):
    train-i uploads once, to `<run>/<i>/checkpoint` (1 W up); rollout-i downloads it (1 W);
    train-i downloads its model (1 W) and the reference only with `train.kl_coef` > 0 (R);
    evaluate-i downloads the new model and, when `eval.modes` has vs_previous, the previous
    one (1-2 W); register-i moves no weight: with the MLflow server's artifact destination
    known it copies the checkpoint inside S3 into the logged model's folder (server-side, 1 W
    `copied`, not through any pod), else the checkpoint already is the registered model.
    Stored: 1 W, once the next register (or `finish`, for the last) drops `<run>/<i>/checkpoint`
    where the registry has its own copy; until then at most two such copies exist in the whole
    run (`after_transient`: the last two iterations', 2 W, not per iteration).

Each line is `RESULT <name> <value>` (bytes, or GB = 1e9 bytes where the name says so).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
import transformers

from sparring.loop.config import CONFIG_DIR, PipelineConfig

# HF config fields of the models the shipped configs name (from their config.json on the hub).
MODEL_SHAPES: dict[str, dict] = {
    "Qwen/Qwen2.5-1.5B-Instruct": {
        "model_type": "qwen2",
        "hidden_size": 1536,
        "intermediate_size": 8960,
        "num_hidden_layers": 28,
        "num_attention_heads": 12,
        "num_key_value_heads": 2,
        "vocab_size": 151936,
        "tie_word_embeddings": True,
        "hub_dtype": "bfloat16",
    },
    "Qwen/Qwen2.5-0.5B-Instruct": {
        "model_type": "qwen2",
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "vocab_size": 151936,
        "tie_word_embeddings": True,
        "hub_dtype": "bfloat16",
    },
}
BYTES = {"float32": 4, "bfloat16": 2}


def stored_params(name: str) -> int:
    """Parameters a safetensors checkpoint of `name` holds (tied weights once)."""
    if name not in MODEL_SHAPES:
        raise SystemExit(f"no shape for {name!r}: add its HF config fields to MODEL_SHAPES")
    fields = {k: v for k, v in MODEL_SHAPES[name].items() if k != "hub_dtype"}
    config = transformers.AutoConfig.for_model(**fields)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())  # parameters() yields a tied tensor once


def per_iteration(
    weights: int, reference: int, kl: bool, vs_previous: bool, registry_copy: bool
) -> dict[str, dict[str, int]]:
    """Bytes stored and moved by one steady-state iteration, before and after (see the module
    docstring): stored, uploaded, downloaded, moved (up + down through the pods), copied
    (inside S3, server-side)."""
    before_down = (
        5 * weights + reference
    )  # rollout, train (model + reference), evaluate x2, register
    after_down = weights * (3 + vs_previous) + reference * kl  # rollout, train, evaluate
    copied = weights if registry_copy else 0
    return {
        "before": {
            "stored": 2 * weights, "uploaded": 2 * weights,
            "downloaded": before_down, "moved": 2 * weights + before_down, "copied": 0,
        },
        "after": {
            "stored": weights, "uploaded": weights,
            "downloaded": after_down, "moved": weights + after_down, "copied": copied,
        },
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", type=Path, default=CONFIG_DIR / "pipeline-gpu.yaml")
    args = parser.parse_args()
    cfg = PipelineConfig.from_yaml(args.config)
    params = stored_params(cfg.model)
    reference = params * BYTES[MODEL_SHAPES[cfg.model]["hub_dtype"]]
    dtype = cfg.train.param_dtype
    weights = params * BYTES[dtype]
    kl, vs_previous = cfg.train.kl_coef > 0, "vs_previous" in cfg.eval.modes
    registry_copy = cfg.tracking.enabled and bool(cfg.tracking.artifacts_destination)
    print(f"RESULT model {cfg.model}")
    print(f"RESULT stored_params {params}")
    print(f"RESULT checkpoint_dtype {dtype}")
    print(f"RESULT checkpoint_bytes {weights}")
    print(f"RESULT reference_bytes {reference}")
    flows = per_iteration(weights, reference, kl, vs_previous, registry_copy)
    for flow, counts in flows.items():
        for key, value in counts.items():
            print(f"RESULT {flow}_{key}_per_iteration_GB {value / 1e9:.2f}")
    print(f"RESULT after_transient_GB {2 * weights * registry_copy / 1e9:.2f}")


if __name__ == "__main__":
    main()
