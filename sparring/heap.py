"""A bounded C heap for CPU tensors.

PyTorch's CPU tensors come from glibc's malloc. glibc serves a block from its heap unless the
block is larger than the mmap threshold, and that threshold grows with every large block freed
(up to 32 MiB), so a process that allocates tensors of many sizes (rollout KV caches, then
training activations) ends up serving them from one heap that only shrinks from its top: the
freed gaps stay resident. A SmolLM2 GRPO step with LoRA r=16 peaked at 10.6 GiB that way and at
6.6 GiB with the threshold fixed at 1 MiB, in the same time (docs/results.md, "Peak RSS of a
SmolLM2 GRPO step on CPU"). `bound()` fixes it at 1 MiB, as `MALLOC_MMAP_THRESHOLD_=1048576`
would: blocks above it are mapped on their own and returned to the system when freed.

Each mapped block costs page faults when it is touched, so a small model pays without gaining:
the tiny model's SFT took 14.5-16.8 s bounded against 11.1 s (system time 8.8-9.9 s against
1.5 s), which made `make run` 16:35 instead of 9:35 (docs/results.md). `bound_for` bounds the
heap only for a model of `MIN_PARAMS` parameters or more; the engine and the trainer call it on
CPU once their model is loaded.

Blocks below the threshold still come from the heap, and its free gaps stay resident after a
task ends: 1.9 GiB of a rollout engine's freed session caches did, which the next task (the
GRPO update, in the same process) then peaked on top of. `releases_memory` makes a task
return them when it ends (glibc's `malloc_trim`).

The bound's mappings fault in page by page on every touch, so a loop that allocates the same
large blocks again and again (the engine's decode step: a (64, 49152) fp32 logits block and its
softmax per token; the trainer's activations, micro-batch after micro-batch) pays the kernel each
time. `reusing()` lifts the bound for such a loop, `reusing_model()` for a model's passes.

`PeakRSS` measures a block's peak resident memory: every task's `perf/<task>_peak_rss_gib`.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import gc
import os
import platform
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import ParamSpec, TypeVar

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
"""mallopt's parameter numbers (malloc.h)."""
THRESHOLD = 1 << 20
"""Blocks above 1 MiB get their own mapping (64 KiB measured the same peak; 4 MiB 7% more)."""
REUSE_THRESHOLD = 32 << 20
"""Within `reusing()`: glibc's own ceiling for its dynamic mmap threshold."""
MIN_PARAMS = 50_000_000
"""Smaller models stay at a few GB unbounded (`make run`'s tiny model: 3.8 GB peak)."""


P = ParamSpec("P")
R = TypeVar("R")


@functools.cache
def _libc() -> ctypes.CDLL | None:
    """glibc, or None on another C library."""
    if platform.libc_ver()[0] != "glibc":
        return None
    return ctypes.CDLL(ctypes.util.find_library("c"))


@functools.cache
def bound(threshold: int = THRESHOLD) -> bool:
    """Fix glibc's mmap threshold (once per process). False where there is no glibc or the user
    set `MALLOC_MMAP_THRESHOLD_` (their choice stands)."""
    libc = _libc()
    if libc is None or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    return bool(libc.mallopt(M_MMAP_THRESHOLD, threshold))


def release() -> None:
    """Collect Python's reference cycles (a model's modules hold some), then hand the C heap's
    free pages back to the system (glibc `malloc_trim(0)`; nothing more off glibc)."""
    gc.collect()
    if (libc := _libc()) is not None:
        libc.malloc_trim(0)


def releases_memory(task: Callable[P, R]) -> Callable[P, R]:
    """`task`, then `release()`: what it freed leaves the process's resident memory."""

    @functools.wraps(task)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return task(*args, **kwargs)
        finally:
            release()

    return run


@contextlib.contextmanager
def reusing(bounded: bool, trim: bool = False) -> Iterator[None]:
    """Within the block, blocks up to `REUSE_THRESHOLD` come from the heap and freeing one keeps
    it there for the next (no mapping, no fresh pages to fault in); after it the bound
    (`bounded`: what `bound` returned) holds again. What the block freed stays resident, ready
    for the next such block, until the task's `release()`, or goes back at its end with
    `trim`. Nothing changes where the heap is not bounded."""
    if not bounded or (libc := _libc()) is None:
        yield
        return
    trim_threshold = int(os.environ.get("MALLOC_TRIM_THRESHOLD_", 128 << 10))  # glibc's default
    libc.mallopt(M_MMAP_THRESHOLD, REUSE_THRESHOLD)
    libc.mallopt(M_TRIM_THRESHOLD, 1 << 30)  # freeing at the top keeps it (at most 1<<30: an int)
    try:
        yield
    finally:
        libc.mallopt(M_MMAP_THRESHOLD, THRESHOLD)
        libc.mallopt(M_TRIM_THRESHOLD, trim_threshold)
        if trim:
            libc.malloc_trim(0)


def reusing_model(model) -> contextlib.AbstractContextManager[None]:
    """`reusing` for a torch model's forward and backward passes, where its heap is bounded (a
    model of `MIN_PARAMS` or more on CPU), with the pages handed back at the end: each
    micro-batch's activations take the pages the last one freed instead of fresh mappings.
    Around each optimizer step's micro-batches it made a SmolLM2 GRPO update 1.45x as fast,
    at a peak 1.9 GiB higher (docs/results.md, "CPU trainer: activations from the heap")."""
    weights = list(model.parameters())
    on_cpu = bool(weights) and weights[0].device.type == "cpu"
    bounded = on_cpu and bound_for(sum(p.numel() for p in weights))
    return reusing(bounded, trim=True)


def bound_for(num_params: int) -> bool:
    """`bound()` for a model of `num_params` parameters on CPU, if it is large enough for the
    heap's growth to matter (`MIN_PARAMS`); False otherwise (or as `bound`)."""
    return num_params >= MIN_PARAMS and bound()


class PeakRSS:
    """The peak resident memory of this process within a `with` block, in GiB (`gib`): the
    largest of the resident sizes sampled every `interval` seconds and, where the block set a
    new high for the process, the kernel's high-water mark (Linux `VmHWM`), which catches
    what sampling misses. Reading it leaves the kernel's own peak, which `time -v` reports,
    untouched."""

    def __init__(self, interval: float = 0.02) -> None:
        self.interval, self.gib = interval, 0.0
        self._stop = threading.Event()

    def __enter__(self) -> PeakRSS:
        import psutil

        self._hwm = _high_water()
        process = psutil.Process()

        def sample() -> None:
            while not self._stop.wait(self.interval):
                self.gib = max(self.gib, process.memory_info().rss / 2**30)

        self.gib = process.memory_info().rss / 2**30
        self._thread = threading.Thread(target=sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        if (hwm := _high_water()) is not None and self._hwm is not None and hwm > self._hwm:
            self.gib = max(self.gib, hwm)


def _high_water() -> float | None:
    """This process's peak resident memory so far in GiB (`VmHWM`), None off Linux."""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return None
    kib = next((line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:")), None)
    return int(kib) / 2**20 if kib else None
