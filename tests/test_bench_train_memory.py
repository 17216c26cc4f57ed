"""bench/train_memory.py end to end at a tiny size: it prints its RESULT line last."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench" / "train_memory.py"


def test_train_memory_bench_smoke(tiny_model_dir):
    args = ["--model", str(tiny_model_dir), "--rows", "4", "--seq-len", "128", "--micro", "2"]
    out = subprocess.run(
        [sys.executable, str(BENCH), *args],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    ).stdout
    name, value = out.strip().splitlines()[-1].split()[1:]
    assert name == "train_peak_rss_mb" and float(value) > 0
