"""The GPU example fits its GPU: training memory computed from the config and the model's shape.

Per train task (sparring.train, one GPU): weights; gradients and AdamW's two moments for every
trainable parameter, in the trained dtype (LoRA adapters stay fp32); autocast's bf16 copies of
fp32 weights, which backward keeps; a frozen reference copy when kl_coef > 0; the activations
autograd keeps for micro_batch_size x max_seq_len tokens (bf16 autocast, SDPA; only the layer
inputs plus one recomputed layer with gradient_checkpointing); and one chunk of the LM head's
logits (sparring.logprobs never holds more). Shapes are the models' published config.json
values; the parameter formula is checked against their published parameter counts, and the
whole estimate against peak CUDA memory measured on an H100 for SmolLM2-135M.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from sparring.logprobs import CHUNK_ELEMENTS

ROOT = Path(__file__).resolve().parents[1]
GiB = 1024**3

# config.json of the Qwen2.5 instruct models: hidden, layers, intermediate, heads, kv heads,
# vocab, tied embeddings; plus the parameter count the model card gives.
MODELS = {
    "Qwen/Qwen2.5-0.5B-Instruct": (896, 24, 4864, 14, 2, 151936, True, 0.49e9),
    "Qwen/Qwen2.5-1.5B-Instruct": (1536, 28, 8960, 12, 2, 151936, True, 1.54e9),
    "Qwen/Qwen2.5-7B-Instruct": (3584, 28, 18944, 28, 4, 152064, False, 7.61e9),
    "smollm2-135m-instruct": (576, 30, 1536, 9, 3, 49152, True, 134.5e6),
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
    w = 2 if train.get("param_dtype") == "bfloat16" else 4  # also the residual stream's bytes
    lora = bool(train.get("lora_rank"))
    trainable, tw = (0.01 * p, 4) if lora else (p, w)
    tokens = train.get("micro_batch_size", 8) * train["max_seq_len"]
    d = h // heads
    # per token and layer, bf16: the q/k/v, o, gate/up and down inputs (autocast casts an input
    # once per matmul), q and k before and after RoPE, v, SDPA's output, the MLP's gate, SiLU,
    # up and product; in the residual dtype: each RMSNorm's input and normalised output
    layer = 2 * (9 * h + 4 * inter + 2 * kv * d) + 4 * h * w
    if train.get("gradient_checkpointing"):
        activations = tokens * (layers * h * w + layer)  # layer inputs + one layer recomputed
    else:
        activations = tokens * layers * layer
    return {
        "weights": p * w,
        "grads+adam": trainable * tw * 3,
        "autocast copies": 2 * p if w == 4 else 0,
        "reference": p * w if train.get("kl_coef", 0) > 0 else 0,
        "activations": activations,
        "logits": CHUNK_ELEMENTS * (2 + 4 + 4),  # one chunk: bf16 head output, fp32 copy, grad
    }


# torch.cuda.max_memory_allocated of one GRPO step of SmolLM2-135M, 8 rows of 4096 tokens in
# micro-batches of 2, bf16 autocast, on an H100 80GB HBM3 (torch 2.11.0+cu130, transformers
# 5.8.1: the GPU image's lock), 2026-11-25, in MiB:
#   python bench/train_memory.py --model smollm2-135m-instruct --device cuda \
#       --rows 8 --seq-len 4096 --micro 2 [flags]
H100_SMOLLM2_MIB = [  # flags, the train config's fields they set, MiB
    ("", {}, 9265),
    ("--gradient-checkpointing", {"gradient_checkpointing": True}, 2671),
    ("--param-dtype bfloat16", {"param_dtype": "bfloat16"}, 7104),
    ("--lora-rank 16", {"lora_rank": 16}, 7937),
    (
        "--param-dtype bfloat16 --gradient-checkpointing",
        {"param_dtype": "bfloat16", "gradient_checkpointing": True},
        1602,
    ),
]


@pytest.mark.parametrize(("flags", "fields", "measured"), H100_SMOLLM2_MIB)
def test_estimate_bounds_the_h100_measurement(flags, fields, measured):
    """The estimate is an upper bound, and a tight one: each measured peak is 75-100% of it."""
    train = {"micro_batch_size": 2, "max_seq_len": 4096, **fields}
    estimate = sum(train_bytes("smollm2-135m-instruct", train).values()) / 2**20
    assert 0.75 <= measured / estimate <= 1.0, (
        f"{flags or 'defaults'}: {measured} of {estimate:.0f}"
    )


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
