"""Benchmarks run end to end at a tiny size and print their RESULT line last."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def bench_output(script: str, *args: str) -> list[str]:
    """The benchmark's stdout lines (it must exit 0)."""
    return (
        subprocess.run(
            [sys.executable, str(ROOT / "bench" / script), *args],
            capture_output=True,
            text=True,
            timeout=600,
            check=True,
        )
        .stdout.strip()
        .splitlines()
    )


def run_bench(script: str, *args: str) -> str:
    return bench_output(script, *args)[-1]


def bench_results(script: str, *args: str) -> dict[str, float]:
    """Every `RESULT <name> <value>` line of the benchmark's output, in order."""
    lines = [line.split() for line in bench_output(script, *args) if line.startswith("RESULT ")]
    return {name: float(value) for _, name, value in lines}


def test_rollout_bench(tiny_model_dir):
    results = bench_results(
        "rollout.py", "--games", "2", "--max-turns", "2", "--model", str(tiny_model_dir)
    )
    assert list(results) == ["rollout_flop_util", "rollout_speedup"]  # the speedup last
    assert 0 < results["rollout_flop_util"] < 1.5 and results["rollout_speedup"] > 0


def test_diplomacy_rollout_bench(tiny_model_dir):
    pytest.importorskip("diplomacy")
    last = run_bench(
        "diplomacy_rollout.py",
        "--games",
        "2",
        "--horizon",
        "1",
        "--no-press",
        "--max-new-tokens",
        "4",
        "--model",
        str(tiny_model_dir),
    )
    name, value = last.split()[1:]
    assert name == "diplomacy_speedup" and float(value) > 0


def test_grouping_ablation_bench(tiny_model_dir, tmp_path):
    """configs/diplomacy-ablation.yaml at smoke size: one seed of every arm runs the product
    loop from the shared warm start; an arm's score is its last evaluation's games against
    greedy (their mean is the champion metric), and the RESULT is country minus init."""
    pytest.importorskip("diplomacy")
    sets = (f"model={tiny_model_dir}", "iterations=1", "game_init.num_train=7")
    sets += ("game_init.num_val=1", "rollout.games_per_init=2", "games_per_iteration=14")
    sets += ("warm_start.num_states=1", "warm_start.train.epochs=1")
    sets += ("rollout.sampling.max_new_tokens=8", "eval.rollout.sampling.max_new_tokens=8")
    args = [arg for pair in sets for arg in ("--set", pair)]
    lines = bench_output("grouping_ablation.py", *args, "--seeds", "0", "--out", str(tmp_path))
    saved = json.loads((tmp_path / "grouping_ablation.json").read_text())
    assert list(saved["arms"]) == ["warm start", "country", "init", "batch"]
    runs = saved["runs"]
    assert [(r["key"], r["seed"]) for r in runs] == [(k, 0) for k in ("country", "init", "batch")]
    assert [json.loads(line) for line in lines if line.startswith("{")] == runs  # one per run
    for run in runs:  # 1 val state x 7 countries vs greedy; the last eval is the champion metric
        assert run["n"] == 7 and run["curve"] == [pytest.approx(run["mean"])]
        assert saved["arms"][run["key"]]["per_seed"] == {"0": pytest.approx(run["mean"])}
    gain = saved["arms"]["country"]["mean"] - saved["arms"]["init"]["mean"]
    assert saved["country_vs_init_gain"] == pytest.approx(gain)
    name, value = lines[-1].split()[1:]
    assert name == "country_vs_init_gain" and float(value) == pytest.approx(gain, abs=5e-5)
    assert (tmp_path / "grouping_ablation.png").stat().st_size > 1000


# The smallest run of a shipped recipe that still warm-starts, plays, trains and evaluates.
SMOKE = ("iterations=1", "game_init.num_val=3", "warm_start.num_states=4")
SMOKE += ("warm_start.train.epochs=1", "rollout.sampling.max_new_tokens=8")
SMOKE += ("eval.rollout.sampling.max_new_tokens=8", "game.params.max_turns=2")


def smoke_args(*pairs: str) -> list[str]:
    return [arg for pair in (*SMOKE, *pairs) for arg in ("--set", pair)]


def test_learning_bench_runs_the_product_loop_per_training_seed(tiny_model_dir, tmp_path):
    """Two training seeds of configs/pipeline.yaml through `run_loop`: each curve starts with
    the evaluation before any update, and the RESULT is the mean of the seeds' paired gains."""
    sets = smoke_args(f"model={tiny_model_dir}", "games_per_iteration=16")
    results = bench_results("learning.py", *sets, "--seeds", "0", "1", "--out", str(tmp_path))
    saved = json.loads((tmp_path / "learning.json").read_text())
    assert sorted(saved["curves"]) == ["0", "1"]
    for curve in saved["curves"].values():
        assert [row["iteration"] for row in curve] == [-1, 0]  # the start, then iteration 0
    gains = [gain for gain, _ in saved["gains"].values()]
    assert list(results) == ["learning_gain"]
    assert results["learning_gain"] == pytest.approx(sum(gains) / 2, abs=5e-4)
    for seed, curve in saved["curves"].items():  # the gain is the champion metric's change
        assert saved["gains"][seed][0] == pytest.approx(curve[-1]["reward"] - curve[0]["reward"])
    assert (tmp_path / "learning.png").stat().st_size > 1000


def test_learning_bench_real_model(smollm2_dir, tmp_path):
    """bench/learning.py on the SmolLM2 recipe (LoRA warm start, one GRPO iteration)."""
    sets = smoke_args(f"model={smollm2_dir}", "games_per_iteration=8", "train.mini_batch_size=2")
    sets += ["--set", "train.micro_batch_size=1", "--set", "warm_start.train.micro_batch_size=1"]
    config = str(ROOT / "configs" / "pipeline-smollm2.yaml")
    results = bench_results("learning.py", "--config", config, *sets, "--out", str(tmp_path))
    assert list(results) == ["learning_gain"] and abs(results["learning_gain"]) <= 1
    saved = json.loads((tmp_path / "learning.json").read_text())
    assert [row["iteration"] for row in saved["curves"]["0"]] == [-1, 0]


def test_engine_profile_rows_add_up_to_the_wall_time(tiny_model_dir):
    """Prefill's own forwards and caches are listed under it, not counted twice: the top-level
    phases sum to at most the wall time."""
    lines = bench_output(
        "engine_profile.py",
        *("--model", str(tiny_model_dir), "--games", "4", "--max-turns", "2"),
        *("--max-new-tokens", "8", "--device", "cpu"),
    )
    wall = float(lines[0].split(" s wall")[0].rsplit(" ", 1)[1])
    start = next(i for i, line in enumerate(lines) if line.startswith("phase"))
    by_rows = next(i for i, line in enumerate(lines) if line.startswith("decode rows"))
    table = lines[start + 1 : by_rows]
    top = [float(line[28:].split()[0]) for line in table if not line.startswith("  ")]
    rounding = 0.005 * (len(top) + 1)  # every figure is printed to 2 decimals
    assert len(top) == 7 and 0.5 * wall < sum(top) <= 1.01 * wall + rounding, (wall, table)
    decode_calls = int(next(line for line in table if line.startswith("_forward")).split()[3])
    buckets = [line for line in lines[by_rows + 1 : -1] if not line.startswith("step time")]
    assert sum(int(line[28:].split()[1]) for line in buckets) == decode_calls, lines[by_rows:]
    name, value = lines[-1].split()[1:]
    assert name == "engine_decode_ms_per_step" and float(value) > 0


@pytest.mark.parametrize(
    "script", ["rollout.py", "learning.py", "train_memory.py", "engine_profile.py"]
)
def test_model_benches_do_not_import_the_mlops_stack(script):
    """The benches a GPU machine runs need torch, transformers and verl, not MLflow or kfp (an
    H100 without them could not run `bench/rollout.py` while it imported the pipeline config)."""
    code = (
        "import runpy, sys\n"
        f"sys.argv = [{script!r}, '--help']\n"
        "try:\n"
        f"    runpy.run_path({str(ROOT / 'bench' / script)!r}, run_name='__main__')\n"
        "except SystemExit:\n"
        "    pass\n"
        "print(sorted(m for m in ('mlflow', 'kfp') if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True
    )
    assert out.stdout.strip().splitlines()[-1] == "[]"
