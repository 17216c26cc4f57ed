"""Will a train task fit its GPU? Peak memory of one `sparring.train` step, from the model's shape.

Per train task (one GPU), in bytes:
  1. weights: params x 4 (fp32) or 2 (`param_dtype: bfloat16`);
  2. gradients and AdamW's two moments of every trainable parameter, in the trained dtype
     (LoRA adapters: fp32, ~1% of the params);
  3. autocast's bf16 copies of fp32 weights, which backward keeps;
  4. a frozen reference copy when `kl_coef` > 0;
  5. the activations autograd keeps for `micro_batch_size` x `max_seq_len` tokens (bf16
     autocast, SDPA attention): every layer's, or with `gradient_checkpointing` the layer
     inputs plus one recomputed layer;
  6. one chunk of the LM head's logits (`CHUNK_ELEMENTS`; `sparring.logprobs` never holds more).
The shapes are the models' published config.json values. The activation terms were calibrated on
peak CUDA memory measured on an H100 for SmolLM2-135M (docs/results.md, "Peak GPU memory of a
SmolLM2 GRPO step"). Pure Python: config validation imports it without torch.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, NamedTuple

CHUNK_ELEMENTS = 1 << 25  # logits per log-prob chunk: 32M fp32 = 128 MiB (682 tokens at V = 49152)
USABLE = 0.9  # of a card's memory left to tensors: CUDA context, allocator fragmentation
GPU_LABEL = "nvidia.com/gpu.product"  # the node label (GPU feature discovery) naming the card


class ModelShape(NamedTuple):
    """A decoder's shape, from its config.json."""

    hidden: int  # hidden_size
    layers: int  # num_hidden_layers
    intermediate: int  # intermediate_size (the MLP's width)
    heads: int  # num_attention_heads
    kv_heads: int  # num_key_value_heads
    vocab: int  # vocab_size
    tied: bool  # tie_word_embeddings: the LM head is the embedding matrix
    qkv_bias: bool  # q, k and v projections have biases (Qwen2) or not (Llama)

    @property
    def params(self) -> int:
        """Parameter count: embeddings (and an untied head), per layer attention, a gated MLP
        and two RMSNorms, and the final norm."""
        h, kv_width = self.hidden, self.kv_heads * (self.hidden // self.heads)
        attn = 2 * h * h + 2 * h * kv_width + (h + 2 * kv_width) * self.qkv_bias  # q, o; k, v
        mlp = 3 * h * self.intermediate  # gate, up, down
        embed = self.vocab * h * (1 if self.tied else 2)
        return embed + self.layers * (attn + mlp + 2 * h) + h


_QWEN = {  # Qwen2.5 sizes: hidden, layers, MLP, heads, KV heads, vocab, tied
    "0.5B": ModelShape(896, 24, 4864, 14, 2, 151936, True, True),
    "1.5B": ModelShape(1536, 28, 8960, 12, 2, 151936, True, True),
    "3B": ModelShape(2048, 36, 11008, 16, 2, 151936, True, True),
    "7B": ModelShape(3584, 28, 18944, 28, 4, 152064, False, True),
    "14B": ModelShape(5120, 48, 13824, 40, 8, 152064, False, True),
    "32B": ModelShape(5120, 64, 27648, 40, 8, 152064, False, True),
}
_SMOLLM2_135M = ModelShape(576, 30, 1536, 9, 3, 49152, True, False)

MODEL_SHAPES: dict[str, ModelShape] = {
    "smollm2-135m-instruct": _SMOLLM2_135M,  # sparring.model_zoo's name
    "HuggingFaceTB/SmolLM2-135M-Instruct": _SMOLLM2_135M,
    **{f"Qwen/Qwen2.5-{size}{kind}": s for size, s in _QWEN.items() for kind in ("", "-Instruct")},
}
"""Shapes of the models configs name, by the `model:` value."""

GPU_MEMORY: dict[str, float] = {
    "NVIDIA-H100-80GB-HBM3": 80e9,
    "NVIDIA-H100-PCIe": 80e9,
    "NVIDIA-H100-NVL": 94e9,
    "NVIDIA-H200": 141e9,
    "NVIDIA-L40S": 48e9,
    "NVIDIA-L4": 24e9,
    "NVIDIA-A10G": 24e9,
    "Tesla-T4": 16e9,
}
"""Bytes of memory by `nvidia.com/gpu.product` label; a label that names its size (`...-40GB`)
needs no entry."""

TRAIN_DEFAULTS: dict[str, Any] = {
    "micro_batch_size": 8,
    "max_seq_len": None,  # None: rows are not cut (fit_warnings then takes the rollout's limit)
    "param_dtype": "float32",
    "lora_rank": 0,
    "gradient_checkpointing": False,
    "kl_coef": 0.0,
}
"""`sparring.train.GRPOConfig`'s defaults of the fields the estimate reads."""


def setting(train: Mapping[str, Any] | Any, name: str) -> Any:
    """Field `name` of a train section, given as a mapping (a config's `train:` dict) or as an
    object (a GRPOConfig); its default where unset."""
    value = train.get(name) if isinstance(train, Mapping) else getattr(train, name, None)
    return TRAIN_DEFAULTS[name] if value is None else value


def gpu_memory(product: str) -> float | None:
    """Bytes of memory of the card with this `nvidia.com/gpu.product` label; None if unknown."""
    if product in GPU_MEMORY:
        return GPU_MEMORY[product]
    size = re.search(r"-(\d+)GB\b", product)
    return float(size.group(1)) * 1e9 if size else None


def train_memory(model: str | ModelShape, train: Mapping[str, Any] | Any) -> dict[str, float]:
    """Peak bytes of one train step of `model` (a MODEL_SHAPES name or a shape) with `train`
    (a mapping or an object with GRPOConfig's fields), by part. Needs `max_seq_len`."""
    shape = MODEL_SHAPES[model] if isinstance(model, str) else model
    seq_len = setting(train, "max_seq_len")
    if seq_len is None:
        raise ValueError("the memory estimate needs train.max_seq_len (the longest row)")
    p, h = shape.params, shape.hidden
    w = 2 if setting(train, "param_dtype") == "bfloat16" else 4  # also the residual's bytes
    trainable, tw = (0.01 * p, 4) if setting(train, "lora_rank") else (p, w)
    tokens = setting(train, "micro_batch_size") * seq_len
    kv_width = shape.kv_heads * (h // shape.heads)
    # per token and layer, bf16: the q/k/v, o, gate/up and down inputs (autocast casts an input
    # once per matmul), q and k before and after RoPE, v, SDPA's output, the MLP's gate, SiLU,
    # up and product; in the residual dtype: each RMSNorm's input and normalised output
    layer = 2 * (9 * h + 4 * shape.intermediate + 2 * kv_width) + 4 * h * w
    if setting(train, "gradient_checkpointing"):
        activations = tokens * (shape.layers * h * w + layer)  # layer inputs + one layer
    else:
        activations = tokens * shape.layers * layer
    return {
        "weights": p * w,
        "grads+adam": trainable * tw * 3,
        "autocast copies": 2 * p if w == 4 else 0,
        "reference": p * w if setting(train, "kl_coef") > 0 else 0,
        "activations": activations,
        "logits": CHUNK_ELEMENTS * (2 + 4 + 4),  # one chunk: bf16 head output, fp32 copy, grad
    }


def train_sections(cfg: Any) -> dict[str, Mapping[str, Any] | Any]:
    """A pipeline config's sections that train on the train GPU (`train`, and
    `warm_start.train` with a warm start), rows cut at the rollout's context limit where the
    section sets no `max_seq_len`."""
    warm_start = getattr(cfg, "warm_start", None)
    sections = {"train": cfg.train}
    if warm_start is not None:
        sections["warm_start.train"] = warm_start.train
    limit = cfg.rollout.max_context_tokens
    for name, train in sections.items():
        if setting(train, "max_seq_len") is None:
            if isinstance(train, Mapping):
                sections[name] = {**train, "max_seq_len": limit}
            else:
                sections[name] = train.model_copy(update={"max_seq_len": limit})
    return sections


def _fixes(name: str, train: Mapping[str, Any] | Any) -> str:
    """The settings of section `name` that would lower the estimate."""
    fixes = [] if setting(train, "gradient_checkpointing") else ["gradient_checkpointing: true"]
    fixes += [] if setting(train, "param_dtype") == "bfloat16" else ["param_dtype: bfloat16"]
    fixes += [] if setting(train, "lora_rank") else ["lora_rank: 16"]
    smaller = f"a smaller {name}.micro_batch_size or {name}.max_seq_len"
    return ", ".join([f"{name}.{fix}" for fix in fixes] + [smaller])


def fit_warnings(cfg: Any) -> list[str]:
    """Why the train (and warm-start) task of a pipeline config would not fit its GPU, one
    line each; empty when it fits, when the model or the card (`kubernetes.node_selector`'s
    nvidia.com/gpu.product) is unknown, or when the task gets no GPU."""
    k8s = cfg.kubernetes
    product = k8s.node_selector.get(GPU_LABEL)
    card = gpu_memory(product) if product else None
    no_gpu = cfg.device == "cpu" or not k8s.train_gpus or cfg.train_backend != "torch"
    if no_gpu or card is None or cfg.model not in MODEL_SHAPES:
        return []
    warnings = []
    for name, train in train_sections(cfg).items():
        parts = train_memory(cfg.model, train)
        total = sum(parts.values())
        if total > USABLE * card:
            shown = ", ".join(f"{k} {v / 1e9:.1f}" for k, v in parts.items() if v)
            warnings.append(
                f"{name}: {cfg.model} needs ~{total / 1e9:.1f} GB per step ({shown}), more than "
                f"the {USABLE * card / 1e9:.0f} GB usable of one {product} "
                f"({card / 1e9:.0f} GB); lower it with {_fixes(name, train)}"
            )
    return warnings
