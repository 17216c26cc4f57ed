"""Linear layers with their weights packed once for oneDNN, for CPU inference.

`nn.Linear` on CPU calls MKL's GEMM, which re-packs the weight matrix into its blocked layout on
every call. At a decode step's few rows that packing is a large part of the call: on the
2-core machine, SmolLM2's 30 layers' projections at 24 rows ran 1.5x faster with the weights
packed once (`torch.ops.mkldnn._reorder_linear_weight`) and multiplied by oneDNN's
`_linear_pointwise`, the pair torch.compile's CPU freezing pass emits; prefill gained as much
(docs/training.md, "Rollout efficiency"). The packed copy replaces the layer's weight, so the
model holds no second copy; the embedding matrix a tied LM head shares stays as it was.

The packed model is for generation only: it has no gradients and its weights cannot be
changed in place.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection

import torch
from torch import nn


class PackedLinear(nn.Module):
    """`nn.Linear`'s forward with the weight pre-packed for oneDNN (inference only)."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach())
        self.bias = None if linear.bias is None else linear.bias.detach()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")


def available() -> bool:
    """oneDNN's fp32 linear ops are in this torch build."""
    return torch.backends.mkldnn.is_available() and hasattr(
        torch.ops.mkldnn, "_reorder_linear_weight"
    )


@functools.cache
def bf16_available() -> bool:
    """oneDNN packs bf16 weights on this CPU: it needs AVX512 (BW, VL, DQ) or AVX-NE-CONVERT,
    and refuses on a CPU with AVX2 only."""
    if not available():
        return False
    try:
        torch.ops.mkldnn._reorder_linear_weight(torch.zeros(8, 8, dtype=torch.bfloat16))
    except RuntimeError:
        return False
    return True


def pack_linears(model: nn.Module) -> int:
    """Replace every fp32 `nn.Linear` of a CPU `model`, and every bf16 one where oneDNN packs
    bf16 here (`bf16_available`), by a `PackedLinear`, in place; returns how many. Does
    nothing (returns 0) where oneDNN is unavailable."""
    if not available():
        return 0
    dtypes = (torch.float32, torch.bfloat16) if bf16_available() else (torch.float32,)
    return replace_linears(model, PackedLinear, dtypes=dtypes)


def replace_linears(
    model: nn.Module,
    make: Callable[[nn.Linear], nn.Module],
    skip: Collection[str] = (),
    dtypes: Collection[torch.dtype] = (torch.float32,),
) -> int:
    """Replace every `nn.Linear` of a CPU `model` whose weight has one of `dtypes` by
    `make(linear)`, in place, except those whose attribute name is in `skip` (say
    `down_proj`); returns how many."""
    swaps = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if type(child) is nn.Linear
        and name not in skip
        and child.weight.device.type == "cpu"
        and child.weight.dtype in dtypes
    ]
    for parent, name, child in swaps:
        setattr(parent, name, make(child))
    return len(swaps)
