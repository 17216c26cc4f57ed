"""A bounded C heap for CPU tensors.

PyTorch's CPU tensors come from glibc's malloc. glibc serves a block from its heap unless the
block is larger than the mmap threshold, and that threshold grows with every large block freed
(up to 32 MiB), so a process that allocates tensors of many sizes (rollout KV caches, then
training activations) ends up serving them from one heap that only shrinks from its top: the
freed gaps stay resident. A SmolLM2 GRPO step with LoRA r=16 peaked at 10.6 GiB that way and at
6.6 GiB with the threshold fixed at 1 MiB, in the same time (docs/results.md, "Peak RSS of a
SmolLM2 GRPO step on CPU"). `bound()` fixes it at 1 MiB, as `MALLOC_MMAP_THRESHOLD_=1048576`
would: blocks above it are mapped on their own and returned to the system when freed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import platform

M_MMAP_THRESHOLD = -3
"""mallopt's parameter number (malloc.h)."""
THRESHOLD = 1 << 20
"""Blocks above 1 MiB get their own mapping (64 KiB measured the same peak; 4 MiB 7% more)."""


@functools.cache
def bound(threshold: int = THRESHOLD) -> bool:
    """Fix glibc's mmap threshold (once per process). False where there is no glibc or the user
    set `MALLOC_MMAP_THRESHOLD_` (their choice stands)."""
    if platform.libc_ver()[0] != "glibc" or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    return bool(libc.mallopt(M_MMAP_THRESHOLD, threshold))
