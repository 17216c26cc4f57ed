"""The GPU example fits its GPU: training memory computed from the config and the model's shape.

Per train task (sparring.train, one GPU): weights, gradients and AdamW's two moments for every
trainable parameter (fp32: 4 + 4 + 8 bytes), a frozen reference copy when kl_coef > 0, the
activations autograd keeps for micro_batch_size x max_seq_len tokens (bf16 autocast, no
recomputation unless gradient_checkpointing), and the logits with their fp32 log-softmax and
its gradient. Shapes are the models' published config.json values; the parameter formula is
checked against their published parameter counts.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
GiB = 1024**3

# config.json of the Qwen2.5 instruct models: hidden, layers, intermediate, heads, kv heads,
# vocab, tied embeddings; plus the parameter count the model card gives.
MODELS = {
    "Qwen/Qwen2.5-0.5B-Instruct": (896, 24, 4864, 14, 2, 151936, True, 0.49e9),
    "Qwen/Qwen2.5-1.5B-Instruct": (1536, 28, 8960, 12, 2, 151936, True, 1.54e9),
    "Qwen/Qwen2.5-7B-Instruct": (3584, 28, 18944, 28, 4, 152064, False, 7.61e9),
}
GPU_MEMORY = {"NVIDIA-H100-80GB-HBM3": 80e9, "NVIDIA-A100-SXM4-80GB": 80e9}
USABLE = 0.9  # CUDA context, allocator fragmentation


def n_params(h, layers, inter, heads, kv, vocab, tied, _published=None) -> int:
    d = h // heads
    attn = h * h + 2 * h * kv * d + h * h + h + 2 * kv * d  # q, k, v, o (+ q/k/v biases)
    mlp = 3 * h * inter  # gate, up, down
    return vocab * h * (1 if tied else 2) + layers * (attn + mlp + 2 * h) + h


def train_bytes(model: str, train: dict) -> dict[str, float]:
    h, layers, inter, heads, kv, vocab, tied, _ = MODELS[model]
    p = n_params(*MODELS[model])
    w = 2 if train.get("param_dtype") == "bfloat16" else 4
    trainable = p if not train.get("lora_rank") else 0.01 * p
    tokens = train.get("micro_batch_size", 8) * train["max_seq_len"]
    d = h // heads
    # per token and layer, bf16: inputs of q/k/v, o, gate/up, down; q, k, v and the attention
    # output for SDPA's backward; fp32: the two residual/norm inputs
    per_layer = 2 * (h + h + h + 3 * inter + h + 2 * kv * d) + 4 * 2 * h
    if train.get("gradient_checkpointing"):
        per_layer = 2 * h  # the layer inputs only; one layer recomputed at a time
        extra_layer = 2 * (4 * h + 3 * inter)
    else:
        extra_layer = 0
    return {
        "weights": p * w,
        "grads+adam": trainable * (w + 8),
        "reference": p * w if train.get("kl_coef", 0) > 0 else 0,
        "activations": tokens * (layers * per_layer + extra_layer),
        "logits": tokens * vocab * (2 + 4 + 4),  # bf16 logits, fp32 log-softmax and its grad
    }


@pytest.mark.parametrize("model", list(MODELS))
def test_parameter_formula_matches_published_counts(model):
    assert n_params(*MODELS[model]) == pytest.approx(MODELS[model][-1], rel=0.01)


def gpu_configs():
    chart = yaml.safe_load((ROOT / "helm" / "sparring" / "values-gpu.yaml").read_text())
    shipped = yaml.safe_load((ROOT / "configs" / "pipeline-gpu.yaml").read_text())
    gpu = chart["pipeline"]["gpu"]["nodeSelector"]["nvidia.com/gpu.product"]
    yield "values-gpu.yaml", chart["pipeline"]["config"], gpu
    yield (
        "pipeline-gpu.yaml",
        shipped,
        shipped["kubernetes"]["node_selector"]["nvidia.com/gpu.product"],
    )


@pytest.mark.parametrize(("name", "cfg", "gpu"), list(gpu_configs()))
def test_gpu_example_fits_its_gpu(name, cfg, gpu):
    parts = train_bytes(cfg["model"], cfg["train"])
    total = sum(parts.values())
    assert total < USABLE * GPU_MEMORY[gpu], (
        f"{name}: {total / GiB:.1f} GiB > {USABLE:.0%} of {gpu}: "
        + ", ".join(f"{k} {v / GiB:.1f}" for k, v in parts.items())
    )


def test_the_old_7b_example_does_not_fit():
    """The check can fail: the previous example (7B, fp32, full AdamW) needs ~122 GB before any
    activation, on an 80 GB GPU."""
    parts = train_bytes("Qwen/Qwen2.5-7B-Instruct", {"micro_batch_size": 2, "max_seq_len": 4096})
    assert (parts["weights"] + parts["grads+adam"]) / 1e9 == pytest.approx(121.8, rel=0.01)
    assert sum(parts.values()) > GPU_MEMORY["NVIDIA-H100-80GB-HBM3"]
