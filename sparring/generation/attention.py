"""Grouped-query attention on CPU without copying keys and values.

transformers' `sdpa` attention repeats each key/value head for its group of query heads
(`repeat_kv`) whenever an attention mask is passed, and the batched engine always passes one
(rows are left-padded). For SmolLM2-135M (9 query heads, 3 key/value heads) at batch 64 and
1,500 cached tokens that copy is ~0.45 GB per layer per decoded token, and one layer's
attention took 7x as long as the same SDPA call with `enable_gqa=True`, which torch's CPU
kernels run with a mask (docs/training.md, "Rollout efficiency"). transformers takes that path only without a mask,
because on CUDA a mask sends GQA to the slow math kernel; so the engine registers this variant
under its own name and uses it on CPU only.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

NAME = "sdpa_gqa"


def sdpa_gqa(
    module: torch.nn.Module,
    query: torch.Tensor,  # (B, H, q, D)
    key: torch.Tensor,  # (B, H_kv, kv, D)
    value: torch.Tensor,  # (B, H_kv, kv, D)
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' sdpa attention, with the key/value heads shared instead of repeated. A
    bf16 decode step (one query per row) goes to `_decode_bf16` instead."""
    if query.dtype == torch.bfloat16 and query.shape[2] == 1:
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        out = _decode_bf16(query, key, value, attention_mask, scale)  # (B, H, 1, D)
        return out.transpose(1, 2).contiguous(), None
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    out = F.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=attention_mask,
        dropout_p=dropout,
        scale=scaling,
        is_causal=bool(causal and attention_mask is None and query.shape[2] > 1),
        enable_gqa=key.shape[1] != query.shape[1],
    )
    return out.transpose(1, 2).contiguous(), None  # (B, q, H, D)


def _decode_bf16(
    query: torch.Tensor,  # (B, H, 1, D)
    key: torch.Tensor,  # (B, H_kv, T, D)
    value: torch.Tensor,  # (B, H_kv, T, D)
    mask: torch.Tensor | None,  # (B, 1, 1, T): bool (True attends) or additive
    scale: float,
) -> torch.Tensor:
    """One decode step's attention in bf16 as two matrix products, a query head's group
    sharing its key/value head, softmax in fp32. torch's fused CPU kernel took 21 ms in bf16
    against 4.4 ms in fp32 for SmolLM2's heads at 64 rows x 800 keys; this takes 3.4 ms, since
    it reads half fp32's bytes (docs/training.md)."""
    b, h, _, d = query.shape
    groups = h // key.shape[1]
    scores = torch.matmul(query.view(b, -1, groups, d), key.transpose(-1, -2))  # (B, H_kv, G, T)
    scores = scores.view(b, h, 1, -1).float() * scale  # (B, H, 1, T)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else (
            scores + mask.float()
        )  # fmt: skip
    weights = scores.softmax(-1).to(query.dtype).view(b, -1, groups, scores.shape[-1])
    return torch.matmul(weights, value).view(b, h, 1, d)


def register() -> str:
    """Make `attn_implementation=NAME` available (with sdpa's masks); returns NAME."""
    AttentionInterface.register(NAME, sdpa_gqa)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    return NAME
