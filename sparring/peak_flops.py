"""How fast this machine multiplies matrices: the yardstick for FLOP utilisation
(`bench/rollout.py`) and for scaling `sparring run`'s time estimate to the CPU it runs on."""

from __future__ import annotations

import time

import torch


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
