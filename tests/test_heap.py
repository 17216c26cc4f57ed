"""sparring.heap: freed tensors leave the process with the heap bounded, and stay without."""

import os
import subprocess
import sys

import pytest

from sparring import heap

# 40 blocks of 8 MiB, each followed by a live 4 KiB tensor, then the blocks freed. After one
# 8 MiB block is freed, glibc's default threshold serves the rest from its heap, whose freed
# gaps (below the live tensors) stay resident; bounded, each block is its own mapping.
SCRIPT = """
import sys, torch
from sparring import heap
if sys.argv[1] == "bound":
    assert heap.bound()
def rss_mib():
    line = next(l for l in open("/proc/self/status") if l.startswith("VmRSS"))
    return int(line.split()[1]) // 1024
warm = torch.ones(2 << 20)
del warm
blocks, pins = [], []
for _ in range(40):
    blocks.append(torch.ones(2 << 20))
    pins.append(torch.ones(1024))
peak = rss_mib()
del blocks
print(peak - rss_mib())
"""


def released_mib(mode: str) -> int:
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_MMAP_THRESHOLD_"}
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, mode], env=env, capture_output=True, text=True, check=True
    )
    return int(out.stdout.split()[-1])


@pytest.mark.skipif(heap.platform.libc_ver()[0] != "glibc", reason="glibc's allocator only")
def test_freed_blocks_leave_the_process_only_with_the_heap_bounded():
    assert released_mib("default") < 40  # of 320 MiB freed, (nearly) nothing returned
    assert released_mib("bound") > 300


def test_a_threshold_the_user_set_stands(monkeypatch):
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "65536")
    heap.bound.cache_clear()
    try:
        assert heap.bound() is False
    finally:
        heap.bound.cache_clear()
