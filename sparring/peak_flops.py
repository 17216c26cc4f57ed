"""How fast this machine multiplies matrices: the yardstick for FLOP utilisation
(`bench/rollout.py`), and whether `cpu_bf16: auto` computes in bf16 on this CPU (`cpu_bf16`)."""

from __future__ import annotations

import functools
import time

import torch

BF16_PAYS = 1.3  # `cpu_bf16: auto`'s threshold: bf16 must beat fp32 by this much


def matmul_peak(device: torch.device, n: int = 2048, seconds: float = 3.0) -> tuple[float, float]:
    """The best rate of an n x n matmul in the weights' dtype (fp32 on CPU, bf16 on CUDA) over
    repeated timings for about `seconds`: FLOP per wall second, and per CPU second of this
    process (which other jobs on a shared machine do not dilute)."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    wall, cpu, t_end = 0.0, 0.0, time.perf_counter() + seconds
    while time.perf_counter() < t_end:
        t0, c0 = time.perf_counter(), time.process_time()
        a @ b
        if device.type == "cuda":
            torch.cuda.synchronize()
        wall = max(wall, 2 * n**3 / (time.perf_counter() - t0))
        cpu = max(cpu, 2 * n**3 / max(time.process_time() - c0, 1e-9))
    return wall, cpu


@functools.cache
def bf16_speedup(rows: int = 256, k: int = 576, n: int = 1536, seconds: float = 0.3) -> float:
    """How many times faster a CPU linear layer (`rows` x `k` by `k` x `n`, SmolLM2's
    projection shape) multiplies in bf16 than in fp32, best of repeated timings over about
    `seconds` each: ~4 where the CPU has bf16 instructions (AVX512-BF16, AMX), well under 1
    where it converts in software (AVX2). Measured once per process."""
    x, w = torch.randn(rows, k), torch.randn(n, k)
    return _best(torch.nn.functional.linear, x, w, seconds) / _best(
        torch.nn.functional.linear, x.bfloat16(), w.bfloat16(), seconds
    )


def cpu_bf16(setting: bool | str) -> bool:
    """Whether a `cpu_bf16` setting (train, warm_start.train) computes in bf16 on this CPU:
    `true` always, `false` never, `auto` where `bf16_speedup()` finds bf16 at least 1.3x
    faster."""
    if setting == "auto":
        return bf16_speedup() >= BF16_PAYS
    return bool(setting)


def _best(f, x: torch.Tensor, w: torch.Tensor, seconds: float) -> float:
    f(x, w)  # warm-up (oneDNN picks its kernel on the first call)
    best, t_end = float("inf"), time.perf_counter() + seconds
    while time.perf_counter() < t_end:
        t0 = time.perf_counter()
        f(x, w)
        best = min(best, time.perf_counter() - t0)
    return best
