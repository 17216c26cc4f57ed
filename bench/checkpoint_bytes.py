"""Checkpoint bytes stored and moved per pipeline iteration, computed from a pipeline config and
its model's shape (no download, no GPU): what issue 15 changed, before and after.

    .venv/bin/python bench/checkpoint_bytes.py                       # configs/pipeline-gpu.yaml
    .venv/bin/python bench/checkpoint_bytes.py --config my.yaml

The model's parameters are counted on the meta device from its HF config fields (written down
below for the models the shipped configs name; tied embeddings are stored once, as
safetensors does). One steady-state iteration i >= 1 of the torch backend (rollout -> train ->
evaluate -> register, no shards, no past-<k> opponents), W = one checkpoint's weights:

  KFP output artifacts (the KFP launcher uploads a task's Output[Model] and downloads it into
  each consumer; they stay in the KFP artifact store):
    train-i writes `trained` (1 W up); rollout-i reads `model` (1 W down); train-i reads `model`
    and `reference` (the initial model, hub dtype); evaluate-i reads `trained` and `previous`
    (2 W down); register-i reads `trained` (1 W down).
  The registry copy: register-i uploads the checkpoint once (1 W up). Before issue 15 it went to
  `<run>/<i>/checkpoint` as a raw HF folder; now it goes into the iteration's MLflow logged
  model's folder and IS the registered MLflow model (MLmodel + tokenizer added, the weights not
  copied again), so an MLflow-native registry costs no third copy.

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


def per_iteration(weights: int, reference: int) -> dict[str, int]:
    """Bytes stored and moved by one steady-state iteration (see the module docstring)."""
    kfp_up, registry_up = weights, weights
    down = 5 * weights + reference  # rollout, train (model + reference), evaluate x2, register
    return {
        "stored": kfp_up + registry_up,
        "uploaded": kfp_up + registry_up,
        "downloaded": down,
        "moved": kfp_up + registry_up + down,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", type=Path, default=CONFIG_DIR / "pipeline-gpu.yaml")
    args = parser.parse_args()
    cfg = PipelineConfig.from_yaml(args.config)
    params = stored_params(cfg.model)
    reference = params * BYTES[MODEL_SHAPES[cfg.model]["hub_dtype"]]
    shipped = cfg.train.param_dtype
    print(f"RESULT model {cfg.model}")
    print(f"RESULT stored_params {params}")
    print(f"RESULT train_param_dtype {shipped}")
    cases = {
        "before": "float32",  # pre-issue-15: always saved fp32
        "after_shipped": shipped,  # saved in the training dtype: the config's train.param_dtype
        "after_bf16": "bfloat16",  # with train.param_dtype: bfloat16
    }
    for case, dtype in cases.items():
        weights = params * BYTES[dtype]
        print(f"RESULT {case}_checkpoint_dtype {dtype}")
        print(f"RESULT {case}_checkpoint_bytes {weights}")
        for key, value in per_iteration(weights, reference).items():
            print(f"RESULT {case}_{key}_per_iteration_GB {value / 1e9:.2f}")


if __name__ == "__main__":
    main()
