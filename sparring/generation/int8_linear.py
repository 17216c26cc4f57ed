"""Linear layers in int8 for CPU generation: PyTorch's dynamic quantization (fbgemm).

A CPU decode step is bound by reading the weights (538 MB of fp32 for SmolLM2-135M, the LM
head a fifth of them). `torch.ao.nn.quantized.dynamic.Linear` stores each weight as int8 with
one scale per output channel and quantizes the activations per call, so a step reads a quarter
of the bytes and multiplies in int8 (fbgemm). On the 2-core AVX2 machine SmolLM2's linear
layers, LM head included, ran 1.6-2.3x faster in int8 than the packed fp32 ones
(`packed_linear`) at 1 to 64 rows and 1.2-1.6x at 256-4,096 rows (docs/results.md); the whole
engine gains less, its attention, norms and sampling staying fp32.

Only decode steps run in int8: inside `full_precision()` (the engine's prefill) every layer
runs its packed fp32 copy. The int8 activations are quantized with one scale per tensor, and
SmolLM2's first token carries activations hundreds of times the others' (an attention sink):
in a prefill forward, which holds that token, they set the scale of every row, and the
quantized model came apart ("The capital of France is" went on " located", not " Paris"; the
KL figures: docs/results.md, "CPU engine: int8 rollout against fp32"). `Int8Linear`
also falls back to fp32 for inputs of fewer than `min_rows` rows, where a machine's int8
kernel is slower (an idle-machine probe found one row slower in int8; the measurement above
did not, hence the default 1: never).

The quantized model samples from a slightly different policy than the fp32 trainer scores:
the rollout correction covers that (docs/training.md, "Quantized rollout"). Generation only:
no gradients, weights fixed.
"""

from __future__ import annotations

import warnings
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch
from torch import nn
from torch.ao.nn.quantized import dynamic
from torch.ao.quantization import per_channel_dynamic_qconfig

from sparring.generation import packed_linear

_FULL_PRECISION: ContextVar[bool] = ContextVar("int8_full_precision", default=False)


@contextmanager
def full_precision() -> Iterator[None]:
    """Every `Int8Linear` runs its fp32 copy inside this block (the engine's prefill)."""
    token = _FULL_PRECISION.set(True)
    try:
        yield
    finally:
        _FULL_PRECISION.reset(token)


class Int8Linear(nn.Module):
    """`nn.Linear` in dynamic int8; in fp32 inside `full_precision()` and for inputs of fewer
    than `min_rows` rows."""

    def __init__(self, linear: nn.Linear, min_rows: int = 1) -> None:
        super().__init__()
        linear.qconfig = per_channel_dynamic_qconfig  # int8 weights, one scale per channel
        with warnings.catch_warnings():  # torch 2.13 deprecates qint8 tensors for torchao,
            # whose CPU int8 linear measured 3-17x slower than this one (docs/results.md)
            warnings.filterwarnings("ignore", "torch.quantize_per_tensor", UserWarning)
            self.int8 = dynamic.Linear.from_float(linear)
        del linear.qconfig
        self.min_rows = min_rows
        self.fp32 = packed_linear.PackedLinear(linear) if packed_linear.available() else linear

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if _FULL_PRECISION.get() or x.numel() // x.shape[-1] < self.min_rows:
            return self.fp32(x)
        return self.int8(x)


def quantize_linears(model: nn.Module, min_rows: int = 1, keep: Collection[str] = ()) -> int:
    """Replace every fp32 `nn.Linear` of a CPU `model` (the LM head included, even when it
    shares the embedding's weight: the embedding keeps its fp32 copy) by an `Int8Linear`, in
    place, except the layers named in `keep` (attribute names, e.g. `down_proj`, `lm_head`);
    returns how many."""
    if "fbgemm" not in torch.backends.quantized.supported_engines:
        raise RuntimeError("int8 rollout needs PyTorch's fbgemm quantized engine (x86 CPUs)")
    names = {
        name
        for module in model.modules()
        for name, child in module.named_children()
        if isinstance(child, nn.Linear)
    }
    if unknown := sorted(set(keep) - names):
        raise ValueError(f"int8_fp32_layers: the model has no layer named {unknown}")
    torch.backends.quantized.engine = "fbgemm"
    return packed_linear.replace_linears(model, lambda linear: Int8Linear(linear, min_rows), keep)
