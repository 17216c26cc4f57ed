"""bench/train.py end to end at a tiny size: it prints its RESULT line last."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench" / "train.py"


def test_train_bench_smoke(tiny_model_dir):
    out = subprocess.run(
        [
            sys.executable,
            str(BENCH),
            "--model",
            str(tiny_model_dir),
            "--batch",
            "2",
            "--seq-len",
            "48",
            "--repeats",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    ).stdout
    lines = out.strip().splitlines()
    assert any("KL on (separate ref model)" in line for line in lines)
    assert any("sdpa_gqa attention" in line for line in lines)
    name, value = lines[-1].split()[1:]
    assert lines[-1].startswith("RESULT") and name == "grpo_step_ratio" and float(value) > 0
