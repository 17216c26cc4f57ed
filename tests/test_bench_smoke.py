"""Benchmarks run end to end at a tiny size and print their RESULT line last."""

from __future__ import annotations

import contextlib
import io
import json
import math
import re
import runpy
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from sample_frames import make_samples
from transformers import AutoModelForCausalLM, AutoTokenizer

from sparring.cli.options import load_config, parse_params
from sparring.games.matching.game import MatchingGame
from sparring.generation import hf, int8_linear
from sparring.loop.config import DEFAULT_CONFIG, PipelineConfig
from sparring.train import collate

ROOT = Path(__file__).resolve().parents[1]


def jsonl(path: Path) -> list[dict]:
    """The rows a benchmark wrote, one JSON object a line."""
    return [json.loads(line) for line in path.read_text().splitlines()]


def positive(row: dict, *keys: str) -> bool:
    return all(math.isfinite(row[k]) and row[k] > 0 for k in keys)


def test_rollout_bench(bench, tiny_model_dir, tmp_path):
    """Both loops play the same 2 games of at most 2 turns; the RESULT lines repeat the rows'
    figures, the speedup last."""
    lines = bench.output(
        "rollout.py",
        *("--games", "2", "--max-turns", "2", "--model", str(tiny_model_dir)),
        *("--out", str(tmp_path)),
    )
    batched, sequential = jsonl(tmp_path / "rollout.jsonl")
    assert (batched["row"], sequential["row"]) == ("batched", "sequential")
    for row in (batched, sequential):
        assert row["games"] == 2
        assert positive(row, "seconds", "cpu_seconds", "games_per_s", "generated_tokens")
        assert positive(row, "tokens_per_s", "forward_share")
    assert positive(batched, "params", "flop_per_s", "matmul_peak", "flop_util", "cpu_flop_util")
    assert positive(sequential, "speedup", "cpu_speedup")
    # one call per seat turn game by game (2-4 per game); batched: one per turn of all games
    assert 2 * 2 <= sequential["generate_calls"] <= 2 * 2 * 3  # up to 2 retries a turn
    assert 1 <= batched["generate_calls"] <= sequential["generate_calls"]
    results = [line.split()[1:] for line in lines if line.startswith("RESULT ")]
    assert [name for name, _ in results] == ["rollout_flop_util", "rollout_speedup"]
    assert lines[-1].startswith("RESULT rollout_speedup ")
    assert float(results[0][1]) == pytest.approx(batched["flop_util"], abs=5e-4)
    assert float(results[1][1]) == pytest.approx(sequential["speedup"], abs=5e-3)


def test_diplomacy_rollout_bench(bench, tiny_model_dir):
    pytest.importorskip("diplomacy")
    last = bench.output(
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
    )[-1]
    name, value = last.split()[1:]
    assert name == "diplomacy_speedup" and float(value) > 0


def test_grouping_ablation_bench(bench, tiny_model_dir, tmp_path, monkeypatch):
    """configs/diplomacy-ablation.yaml at smoke size: one seed of two arms runs the product loop
    from the shared warm start; an arm's score is its final model's games against greedy on
    the test state (the loop's test step; the val curve is the champion metric), and the
    RESULT is country minus init_seat, paired game by game, with its 95% interval; then the
    arms' checkpoints play each other on the test state. The report of the folder (what
    `--merge` prints) is the same."""
    pytest.importorskip("diplomacy")
    sets = (f"model={tiny_model_dir}", "iterations=1", "game_init.num_train=7")
    sets += ("game_init.num_val=1", "game_init.num_test=1")
    sets += ("rollout.games_per_init=2", "games_per_iteration=14")
    sets += ("warm_start.num_states=1", "warm_start.train.epochs=1")
    sets += ("rollout.sampling.max_new_tokens=8", "eval.rollout.sampling.max_new_tokens=8")
    sets += ("eval.breakdown=false",)  # val: greedy alone, not every bot (tests/test_evaluate.py)
    args = [arg for pair in sets for arg in ("--set", pair)]
    keys = ("country", "init_seat")  # of the default four arms, the two the RESULT compares
    lines = bench.output(
        "grouping_ablation.py", *args, "--keys", *keys, "--seeds", "0", "--out", str(tmp_path)
    )
    saved = json.loads((tmp_path / "grouping_ablation.json").read_text())
    assert list(saved["arms"]) == ["warm start", *keys]
    runs = saved["runs"]
    assert [(r["key"], r["seed"]) for r in runs] == [(k, 0) for k in keys]
    assert [json.loads(line) for line in lines if line.startswith("{")] == runs  # one per run
    assert saved["states"] == "test"
    for run in runs:  # 1 test state x 7 countries vs greedy, the loop's test step's final model
        test = json.loads((tmp_path / f"{run['key']}-seed-0" / "test" / "test.json").read_text())
        assert run["n"] == 7 and run["mean"] == pytest.approx(test["figures"]["test/final"])
        assert len(run["curve"]) == 1  # the val curve: the champion metric per iteration
        assert saved["arms"][run["key"]]["per_seed"] == {"0": pytest.approx(run["mean"])}
    assert saved["arms"]["warm start"]["mean"] == pytest.approx(test["figures"]["test/start"])
    gain = saved["arms"]["country"]["mean"] - saved["arms"]["init_seat"]["mean"]
    versus = saved["versus"]["country_vs_init_country"]  # paired: the same 7 games
    assert list(saved["versus"]) == ["country_vs_init_country", "league_country_vs_init_country"]
    assert versus["gain"] == pytest.approx(gain)
    low, high = versus["ci95"]
    assert low <= gain <= high and high - gain == pytest.approx(gain - low)
    gains = saved["gains"]  # every arm over the warm start, and over init_seat
    assert gains["country"]["over init_seat"] == versus and set(gains["init_seat"]) == {
        "over warm start"
    }
    warm = saved["arms"]["warm start"]["mean"]
    over_warm = gains["country"]["over warm start"]["gain"]
    assert over_warm == pytest.approx(saved["arms"]["country"]["mean"] - warm)
    # the league: in each of 2 games per state the arms hold alternate powers, so each plays
    # all 7 once; its comparison pairs the arms' rewards by state and power
    league = saved["league"]
    assert list(league) == list(keys) and all(league[k]["n"] == 7 for k in keys)
    seats = json.loads((tmp_path / "league-test-seed-0.json").read_text())
    assert sorted(seats["country"]) == sorted(seats["init_seat"])  # the same 7 positions
    assert len({key.rsplit("/", 1)[1] for key in seats["country"]}) == 7
    league_gain = league["country"]["mean"] - league["init_seat"]["mean"]
    results = [line.split()[1:] for line in lines if line.startswith("RESULT ")]
    assert [name for name, _ in results] == [
        f"{prefix}country_vs_init_country_{stat}"
        for prefix in ("", "league_")
        for stat in ("gain", "ci95_low", "ci95_high")
    ]
    assert [float(v) for _, v in results[:3]] == pytest.approx([gain, low, high], abs=5e-5)
    assert float(results[3][1]) == pytest.approx(league_gain, abs=5e-5)
    for plot in ("grouping_ablation.png", "grouping_ablation_league.png"):
        assert (tmp_path / plot).stat().st_size > 1000
    monkeypatch.syspath_prepend(str(ROOT / "bench"))  # its `from learning import ...`
    ablation = runpy.run_path(str(ROOT / "bench" / "grouping_ablation.py"))  # not as __main__
    with contextlib.redirect_stdout(io.StringIO()) as printed:  # --merge of the one folder
        ablation["report"]([tmp_path], tmp_path / "all")
    merged = [line for line in printed.getvalue().splitlines() if line.startswith("RESULT ")]
    assert merged == [line for line in lines if line.startswith("RESULT ")]
    # a second seed cut short in init_seat: its folder lists only the run that finished
    # (country) and played no league; the merge compares the arms on the seed both finished
    cut = tmp_path / "cut"
    shutil.copytree(tmp_path / "warm", cut / "warm")
    shutil.copytree(tmp_path / "country-seed-0", cut / "country-seed-1")
    cut_runs = [dict(run, seed=1) for run in runs if run["key"] == "country"]
    (cut / "grouping_ablation.json").write_text(json.dumps(dict(saved, runs=cut_runs)))
    with contextlib.redirect_stdout(io.StringIO()):
        ablation["report"]([tmp_path, cut], tmp_path / "both", play=False)  # as --merge
    both = json.loads((tmp_path / "both" / "grouping_ablation.json").read_text())
    assert list(both["arms"]["country"]["per_seed"]) == ["0", "1"]
    assert list(both["arms"]["init_seat"]["per_seed"]) == ["0"]
    assert both["versus"]["country_vs_init_country"] == versus  # seed 0's alone
    assert list(both["league"]["country"]["per_seed"]) == ["0"]
    # merged where the checkpoints are not (another machine): the seeds' played leagues only
    (tmp_path / "league-test-seed-0.json").unlink()
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        ablation["report"]([tmp_path], tmp_path / "elsewhere", play=False)
    merged = [line for line in printed.getvalue().splitlines() if line.startswith("RESULT ")]
    assert merged == [line for line in lines if line.startswith("RESULT country")]
    assert (
        json.loads((tmp_path / "elsewhere" / "grouping_ablation.json").read_text())["league"] == {}
    )


def test_kuhn_bench_keeps_a_populations_members(tmp_path, monkeypatch):
    """With a population a curve's row keeps each member's rating and exploitability (the
    iteration's figure is its lead's), and the report draws each member's curve."""
    monkeypatch.syspath_prepend(str(ROOT / "bench"))  # its `from learning import ...`
    kuhn = runpy.run_path(str(ROOT / "bench" / "kuhn.py"))  # not as __main__
    metrics = {"eval/exploitability": 0.4, "eval/card_dependence": 0.1, "train/loss": 0.3}
    metrics |= {"population/member-0/rating": 20.0, "population/member-0/train/loss": 0.2}
    metrics |= {"population/member-0/eval/exploitability": 0.4}
    metrics |= {"population/member-1/rating": 18.0, "population/member-1/eval/exploitability": 0.5}
    metrics |= {"eval/p_bet/0pb": 0.3}  # the table, kept for the average
    assert sorted(kept := kuhn["row"](metrics)) == sorted(
        ["eval/card_dependence", "eval/p_bet/0pb"]
        + [f"population/member-{i}/{k}" for i in (0, 1) for k in ("rating", "eval/exploitability")]
    )
    curve = [{"seed": 0, "iteration": -1, "eval/exploitability": 0.45}]
    curve += [{"seed": 0, "iteration": i, "eval/exploitability": 0.4, **kept} for i in (0, 1)]
    saved = {"config": "configs/kuhn.yaml", "set": ["population.size=2"], "curves": {"0": curve}}
    with contextlib.redirect_stdout(io.StringIO()):
        kuhn["report"](saved, tmp_path)
    assert (tmp_path / "kuhn_population.png").stat().st_size > 1000  # each member's curve
    saved["set"] = []  # one learner: no member plot
    (tmp_path / "single").mkdir()
    with contextlib.redirect_stdout(io.StringIO()):
        kuhn["report"](saved, tmp_path / "single")
    assert not (tmp_path / "single" / "kuhn_population.png").exists()


def test_kuhn_bench_merges_side_by_side_runs(bench, tmp_path):
    """`--merge` of per-seed folders: one kuhn.json with every seed's curve, a run stopped early
    counting its last evaluation as final, and the RESULTs (exploitability and card
    dependence, start and final) their mean and s.e. over seeds. The average is each seed's
    updated tables mixed: seed 0's two Nash tables (0), seed 1's always-call (1/3)."""
    from sparring.games.textarena import exploitability as kuhn

    exploitability = {"0": [0.8, 0.5, 0.34], "1": [0.34, 0.33]}  # seed 1 stopped early
    cards = {"0": [0.0, 0.2, 0.5], "1": [0.1, 0.7]}
    tables = {"0": [kuhn.UNIFORM, kuhn.NASH, kuhn.NASH], "1": [kuhn.UNIFORM, kuhn.ALWAYS_CALL]}
    for seed, values in exploitability.items():
        pairs = enumerate(zip(values, cards[seed], tables[seed], strict=True))
        curve = [{"seed": int(seed), "iteration": i - 1, "eval/exploitability": v,
                  "eval/card_dependence": c} | {f"eval/p_bet/{s}": r["Bet"] for s, r in t.items()}
                 for i, (v, c, t) in pairs]  # fmt: skip
        (tmp_path / seed).mkdir()
        saved = {"config": "configs/kuhn-smollm2.yaml", "set": [], "curves": {seed: curve}}
        (tmp_path / seed / "kuhn.json").write_text(json.dumps(saved))
    out = tmp_path / "all"
    folders = [str(tmp_path / seed) for seed in exploitability]
    lines = bench.output("kuhn.py", "--merge", *folders, "--out", str(out))
    results = {w[1]: float(w[2]) for w in map(str.split, lines) if w[0] == "RESULT"}
    finals = {line.split(",")[0]: line for line in lines if line.startswith("seed ")}
    assert "2p 1.00 (0.333)" in finals["seed 0"]  # Nash bets the K after a check, met 1/3
    assert "2b 1.00 (0.000)" in finals["seed 1"]  # always-call never bets first
    fixes = next(line for line in lines if line.startswith("seed 1: exploitability"))
    assert fixes.count(" -> ") == 3  # always-call's three best single-state repairs
    assert all(float(cell.rsplit(": ", 1)[1]) < 1 / 3 for cell in fixes.split(", "))
    merged = json.loads((out / "kuhn.json").read_text())["curves"]
    assert {seed: [r["eval/exploitability"] for r in c] for seed, c in merged.items()} == (
        exploitability
    )
    start, final = [0.8, 0.34], [0.34, 0.33]
    assert results["kuhn_exploitability_start"] == pytest.approx(np.mean(start), abs=1e-4)
    assert results["kuhn_exploitability_final"] == pytest.approx(np.mean(final), abs=1e-4)
    se = np.std(final, ddof=1) / np.sqrt(2)
    assert results["kuhn_exploitability_final_se_seeds"] == pytest.approx(se, abs=1e-4)
    assert results["kuhn_card_dependence_start"] == pytest.approx(0.05, abs=1e-4)
    assert results["kuhn_card_dependence_final"] == pytest.approx(0.6, abs=1e-4)
    assert results["kuhn_exploitability_average"] == pytest.approx(1 / 6, abs=1e-4)
    assert results["kuhn_exploitability_average_se_seeds"] == pytest.approx(1 / 6, abs=1e-4)
    assert results["kuhn_exploitability_average_linear"] == pytest.approx(1 / 6, abs=1e-4)
    assert (out / "kuhn.png").stat().st_size > 1000


def test_kuhn_bench_mixes_the_iterates_uniformly_and_linearly(monkeypatch):
    """The report's mixtures of the updated tables after the start: uniform, and linear (the
    t-th weighs t), so that a run that ends at Nash after always-call is less exploitable
    mixed linearly, and a mixture of one table is that table."""
    from sparring.games.textarena import exploitability as kuhn

    monkeypatch.syspath_prepend(str(ROOT / "bench"))  # its `from learning import ...`
    averaged = runpy.run_path(str(ROOT / "bench" / "kuhn.py"))["averaged"]
    curve = [{f"p_bet/{s}": r["Bet"] for s, r in t.items()}
             for t in (kuhn.UNIFORM, kuhn.ALWAYS_CALL, kuhn.NASH)]  # fmt: skip
    curve = [{f"eval/{k}": v for k, v in row.items()} for row in curve]
    uniform, linear = averaged(curve), averaged(curve, "linear")
    assert uniform[0] == linear[0] == pytest.approx(1 / 3)  # always-call alone
    tables = [kuhn.ALWAYS_CALL, kuhn.NASH]
    assert uniform[1] == pytest.approx(kuhn.exploitability(kuhn.mixture(tables)))
    assert linear[1] == pytest.approx(kuhn.exploitability(kuhn.mixture(tables, [1.0, 2.0])))
    assert linear[1] < uniform[1] - 0.01


def test_kuhn_bench_distills_a_folders_stored_iterates(bench, tiny_model_dir, tmp_path):
    """`--merge DIR --average`: the loop's distillation (`tasks.average`, with the config's
    `average`) of the run DIR stored: its last checkpoint fine-tuned on every iteration's
    rollout (duplicates merged), and the distilled model's own table scored."""
    from sparring import storage
    from sparring.games.textarena import exploitability as kuhn
    from sparring.generation.hf import HFBackend

    folder, run = tmp_path / "seed0", tmp_path / "seed0" / "store" / "run-a"
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    rows = make_samples(tokenizer, [0.0, 1.0]).assign(temperature=2.0, top_p=1.0)
    for i in (0, 1):  # two iterations' rollouts, row 0 played twice in each, as stored
        rows.iloc[[0, 0, 1]].to_parquet(tmp_path / f"samples-{i}.parquet")
        (tmp_path / f"rollout-{i}").mkdir()
        shutil.move(
            tmp_path / f"samples-{i}.parquet", tmp_path / f"rollout-{i}" / "samples.parquet"
        )
        storage.upload_dir(tmp_path / f"rollout-{i}", str(run / str(i) / "rollout"))
    shutil.copytree(tiny_model_dir, run / "1" / "checkpoint")
    curve = [{"seed": 0, "iteration": i - 1, "eval/exploitability": 0.3} | {
        f"eval/p_bet/{s}": r["Bet"] for s, r in kuhn.UNIFORM.items()} for i in range(3)]  # fmt: skip
    sets = ["iterations=2", "average={train: {steps: 2}}"]  # the config's average, in brief
    saved = {"config": "configs/kuhn.yaml", "set": sets, "curves": {"0": curve}}
    (folder / "kuhn.json").write_text(json.dumps(saved))
    out = tmp_path / "all"
    lines = bench.output("kuhn.py", "--merge", str(folder), "--average", "--out", str(out))
    results = {w[1]: float(w[2]) for w in map(str.split, lines) if w[0] == "RESULT"}
    distilled = out / "seed-0-average"
    metrics = json.loads((distilled / "metrics.json").read_text())
    assert (metrics["train/samples"], metrics["train/distinct_samples"]) == (6, 2)
    assert metrics["train/optimizer_steps"] == 2
    cfg = load_config(PipelineConfig, str(ROOT / "configs" / "kuhn.yaml"), {})
    table = kuhn.read_policy(HFBackend(str(distilled)), cfg.game.make(), 1.0)
    assert results["kuhn_exploitability_distilled"] == pytest.approx(
        kuhn.exploitability(table), abs=1e-4
    )
    kept = json.loads((out / "kuhn.json").read_text())["distilled"]["0"]
    assert kept["iterations"] == [0, 1]
    (run.parent / "run-b").mkdir()  # two runs and no name recorded: which is seed 0's?
    code, _, err = bench.run("kuhn.py", "--merge", str(folder), "--average", "--out", str(out))
    assert code != 0 and "holds 2 runs" in err


def test_micro_batches_bench(bench, tiny_model_dir, tmp_path):
    """Sorted and row-order splits of the same update: fewer padded tokens sorted, the same
    weights after it up to rounding, and the speedup as the RESULT."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    df = pd.concat([make_samples(tokenizer, [1.0, 0.0, 0.3, 0.6]).assign(init=f"s{i}")
                    for i in range(2)], ignore_index=True)  # fmt: skip
    df["init"] = df["init"] + df["seat"].astype(str)  # groups of 2 with different rewards
    samples = tmp_path / "samples.parquet"
    df.to_parquet(samples, index=False)
    sets = ("train.mini_batch_size=8", "train.micro_batch_size=2", "train.bypass_mode=false")
    lines = bench.output(
        "micro_batches.py", "--model", str(tiny_model_dir), "--samples", str(samples),
        *(arg for pair in sets for arg in ("--set", pair)), "--repeats", "1",
    )  # fmt: skip
    tokens = {line.split()[0]: int(line.split("tokens ")[1].split()[0]) for line in lines
              if line.strip().startswith(("sorted", "row"))}  # fmt: skip
    assert tokens["sorted"] < tokens["row"]
    difference = float(next(line for line in lines if "weight difference" in line).split()[-1])
    assert difference < 1e-4
    name, value = lines[-1].split()[1:]
    assert name == "length_sorted_speedup" and float(value) > 0


def test_shared_prefix_bench(bench, tiny_model_dir, tmp_path):
    """Plain, shared-prefix and prompt mini-batch updates of the same samples, two rounds each:
    fewer forward tokens packed, the shared-prefix update plain's up to rounding, both speedups
    as RESULTs."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    df = make_samples(tokenizer, [1.0, 0.0, 0.3, 0.6, 0.2, 0.9, 0.5, 0.1])  # 4 prompt groups of 2
    # one mini-batch: each micro-batch of 2 then holds one prompt group, packed
    samples = tmp_path / "samples.parquet"
    df.to_parquet(samples, index=False)
    sets = ("train.mini_batch_size=8", "train.micro_batch_size=2", "train.bypass_mode=false")
    lines = bench.output(
        "shared_prefix.py", "--model", str(tiny_model_dir), "--samples", str(samples),
        "--config", "configs/pipeline.yaml", "--prompt-micro-batch", "2", "--repeats", "2",
        *(arg for pair in sets for arg in ("--set", pair)),
    )  # fmt: skip
    arms = {line.split("  cpu")[0].strip(): line for line in lines if "  cpu " in line}
    assert all(len(line.split("by round: ")[1].split()) == 2 for line in arms.values())
    tokens = {name: int(line.split("forward tokens ")[1].split()[0]) for name, line in arms.items()}
    assert tokens["share_prefix"] < tokens["plain"]
    gap = float(arms["share_prefix"].split("update off plain's by ")[1].split()[0])
    assert gap < 1e-3
    results = dict(line.split()[1:] for line in lines if line.startswith("RESULT"))
    assert list(results) == ["shared_prefix_update_speedup", "prompt_batches_update_speedup"]
    assert all(float(v) > 0 for v in results.values())


# The smallest run of a shipped recipe that still warm-starts, plays, trains and evaluates
# (8 train states: the warm start's and the iteration's; a recipe's 512 take 7 s to generate),
# with short games: 2 turns of 8-token replies, an invalid one forfeited, not retried.
SMOKE = ("iterations=1", "game_init.num_train=8", "game_init.num_val=3", "game_init.num_test=2")
SMOKE += ("warm_start.num_states=4", "warm_start.train.epochs=1")
SMOKE += ("rollout.sampling.max_new_tokens=8", "eval.rollout.sampling.max_new_tokens=8")
SMOKE += ("game.params.max_turns=2", "game.params.max_retries=0")


def smoke_args(*pairs: str) -> list[str]:
    return [arg for pair in (*SMOKE, *pairs) for arg in ("--set", pair)]


def test_learning_bench_runs_the_product_loop_per_training_seed(bench, tiny_model_dir, tmp_path):
    """Two training seeds of configs/pipeline.yaml through `run_loop`: each curve starts with
    the evaluation before any update, the RESULT is the mean of the seeds' paired gains, and
    the test figures are summarized across the seeds. An arm (here the t1 arm) starts from the
    seed's warm start (the same start score) and is compared with the recipe on test, per
    seed. Split into one folder per seed and arm and merged, the runs give the same report."""
    sets = smoke_args(f"model={tiny_model_dir}", "games_per_iteration=8")
    arm = ("--t1-arm",)
    results = bench.results("learning.py", *sets, *arm, "--seeds", "0", "1", "--out", str(tmp_path))
    saved = json.loads((tmp_path / "learning.json").read_text())
    curves = saved["arms"]["recipe"]
    assert sorted(curves) == ["0", "1"]
    baselines = {b.name for b in MatchingGame.baselines()}
    for curve in curves.values():
        assert [row["iteration"] for row in curve] == [-1, 0]  # the start, then iteration 0
        assert all(set(row["baselines"]) == baselines for row in curve)  # drawn in the plot
        peaks = [curve[-1].get(f"perf/{task}_peak_rss_gib", 0) for task in ("rollout", "train")]
        assert min(peaks + [curve[0].get("perf/eval_peak_rss_gib", 0)]) > 0.1  # memory by phase
    gains = [gain for gain, _ in saved["gains"].values()]
    assert list(results)[0] == "learning_gain"
    assert results["learning_gain"] == pytest.approx(sum(gains) / 2, abs=5e-4)
    for seed, curve in curves.items():  # the gain is the champion metric's change
        assert saved["gains"][seed][0] == pytest.approx(curve[-1]["reward"] - curve[0]["reward"])
        t1 = saved["arms"]["t1"][seed]
        assert t1[0]["reward"] == curve[0]["reward"]  # one warm start, evaluated alike
        assert not (tmp_path / f"seed-{seed}-t1" / "warm").exists()  # not warm-started again
    assert saved["versus_recipe"]["t1"]["split"] == "test"
    versus = [d for d, _ in saved["versus_recipe"]["t1"]["seeds"].values()]
    assert results["arm_t1_minus_recipe"] == pytest.approx(sum(versus) / 2, abs=5e-4)
    assert (tmp_path / "learning.png").stat().st_size > 1000
    test = saved["test"]  # both seeds' test gains, their mean and its s.e. across the two
    seeds = [test["seeds"][s]["test/gain"] for s in ("0", "1")]
    # transcripts.md: the best seed's kept val games at the start and the end, then the worst's
    said = (tmp_path / "transcripts.md").read_text()
    best, worst = ("0", "1") if seeds[0] > seeds[1] else ("1", "0")
    heads = [line for line in said.splitlines() if line.startswith("## ")]
    assert heads == [
        f"## The best seed ({best}), the start", f"## The best seed ({best}), after iteration 0",
        f"## The worst seed ({worst}), the start", f"## The worst seed ({worst}), after iteration 0",
    ]  # fmt: skip
    kept = json.loads((tmp_path / f"seed-{best}" / "-1" / "eval" / "transcripts.json").read_text())
    first = kept["selfplay"][0]
    assert f"**{first['game_id']}**" in said
    assert all(word in said for turn in first["transcript"] for word in turn["text"].split()[:1])
    assert test["mean"]["test/gain"] == pytest.approx(sum(seeds) / 2)
    assert test["se_seeds"]["test/gain"] == pytest.approx(abs(seeds[0] - seeds[1]) / 2)
    margins = [test["seeds"][s]["test/gain_over_best_trivial"] for s in ("0", "1")]
    assert results["real_gain_over_best_trivial"] == pytest.approx(sum(margins) / 2, abs=5e-5)
    se = abs(margins[0] - margins[1]) / 2
    assert results["real_gain_over_best_trivial_se_seeds"] == pytest.approx(se, abs=5e-5)
    assert results["real_test_reward"] == pytest.approx(test["mean"]["test/final"], abs=5e-5)
    assert results["real_gain_over_warm_start"] == pytest.approx(
        test["mean"]["test/gain"], abs=5e-5
    )
    # one folder per seed and arm, as side-by-side processes leave them: merged, the same report
    kept = {k: saved[k] for k in ("config", "set", "metric", "title", "arm_sets")}
    folders = []
    for seed in ("0", "1"):
        for arm, run in (("recipe", f"seed-{seed}"), ("t1", f"seed-{seed}-t1")):
            alone = tmp_path / f"only-{seed}-{arm}"
            alone.mkdir()
            (alone / run).symlink_to(tmp_path / run)
            arms = {arm: {seed: saved["arms"][arm][seed]}}
            (alone / "learning.json").write_text(json.dumps(kept | {"arms": arms}))
            folders.append(alone)
    learning = runpy.run_path(str(ROOT / "bench" / "learning.py"))  # not run as __main__
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        learning["report"](learning["gathered"](folders), tmp_path / "all")
    merged = [
        line.split() for line in printed.getvalue().splitlines() if line.startswith("RESULT ")
    ]
    assert {name: float(value) for _, name, value in merged} == results
    # seed 1 cut before its first update (its folder: the start's evaluation, no test step):
    # alone it has no gain to report; beside seed 0 the report is seed 0's
    cut = tmp_path / "cut"
    (cut / "seed-1").mkdir(parents=True)
    (cut / "seed-1" / "-1").symlink_to(tmp_path / "seed-1" / "-1")
    start = {"recipe": {"1": saved["arms"]["recipe"]["1"][:1]}}
    (cut / "learning.json").write_text(json.dumps(kept | {"arms": start}))
    for merged_with, expected in (([], None), ([folders[0]], saved["gains"]["0"][0])):
        with contextlib.redirect_stdout(io.StringIO()) as printed:
            learning["report"](learning["gathered"]([*merged_with, cut]), tmp_path / "cut-all")
        lines = printed.getvalue().splitlines()
        gains = [float(line.split()[2]) for line in lines if "RESULT learning_gain" in line]
        if expected is None:
            assert gains == [] and any("no GRPO iteration to report" in line for line in lines)
        else:
            assert gains == [pytest.approx(expected, abs=5e-4)]
    # the t1 arm of both seeds cut during its test step: compared with the recipe on val, at
    # the last iteration both ran, paired game by game, and labelled so (it printed nan)
    arm_cut = tmp_path / "arm-cut"
    for seed in ("0", "1"):
        (arm_cut / f"seed-{seed}-t1").mkdir(parents=True)
        for it in ("-1", "0"):
            (arm_cut / f"seed-{seed}-t1" / it).symlink_to(tmp_path / f"seed-{seed}-t1" / it)
    (arm_cut / "learning.json").write_text(json.dumps(kept | {"arms": {"t1": saved["arms"]["t1"]}}))
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        summary = learning["gathered"]([folders[0], folders[2], arm_cut])
        learning["report"](summary, tmp_path / "arm-cut-all")
    said = printed.getvalue()
    on_val = [
        sum(saved["arms"]["t1"][s][-1]["val_scores"][g] - saved["arms"]["recipe"][s][-1]["val_scores"][g]
            for g in saved["arms"]["recipe"][s][-1]["val_scores"])
        / len(saved["arms"]["recipe"][s][-1]["val_scores"])
        for s in ("0", "1")
    ]  # fmt: skip
    assert summary["versus_recipe"]["t1"]["split"] == "val"
    assert "last common iteration on val" in said and "nan" not in said
    assert "RESULT arm_t1_minus_recipe " not in said
    value = float(said.split("RESULT arm_t1_minus_recipe_on_val ")[1].split()[0])
    assert value == pytest.approx(sum(on_val) / 2, abs=5e-4)


def test_learning_bench_checks_every_arm_before_it_runs_anything(bench, tmp_path):
    """An arm whose settings the recipe rejects (the int8 engine with `bypass_mode`, which
    the make-run config sets) stops the bench at once, naming the arm and what to change,
    before the recipe's run: not after it, as it did."""
    code, out, err = bench.run(
        "learning.py", "--arm", "ok", "train.lr=1e-4", "--arm", "int8",
        "rollout.backend.quantize=int8", "--out", str(tmp_path),
    )  # fmt: skip
    assert code == 2, err
    assert "--arm int8: invalid PipelineConfig" in err and "bypass_mode: false" in err
    assert "--arm ok" not in err
    assert list(tmp_path.iterdir()) == []  # no run started


def test_estimate_bench_fits_the_costs_of_the_run_it_times(bench):
    """The smallest run of the embedded default, with its services: the costs it fitted
    account for the whole wall time at the run's own probe (what a refit pastes into
    `COSTS`), and the RESULT is the estimate printed at the start over that wall time."""
    from sparring.loop import estimate

    lines = bench.output("estimate.py", *smoke_args("games_per_iteration=8"))
    fitted = eval(next(line for line in lines if line.startswith("fitted: ")).removeprefix(
        "fitted: "), vars(estimate))  # fmt: skip
    wall = float(re.search(r"wall (\d+) s", "\n".join(lines)).group(1))
    cfg = load_config(PipelineConfig, str(DEFAULT_CONFIG), parse_params(tuple(SMOKE)))
    cfg = cfg.model_copy(update={"games_per_iteration": 8})
    w = estimate.work(cfg, fitted.budget)
    spent = sum(getattr(w, k) * getattr(fitted, k) for k in ("sft", "rollout", "train", "eval"))
    assert spent + w.tasks * fitted.task == pytest.approx(wall, abs=1)  # the wall, rounded
    assert all(getattr(fitted, k) > 0 for k in ("sft", "rollout", "eval"))  # an update may
    assert fitted.train >= 0  # be skipped at this size (no group with a reward spread)
    name, value = lines[-1].split()[1:]
    assert name == "estimate_over_wall" and float(value) > 0


def test_t1_arm_scores_every_row_at_temperature_1(tiny_model_dir):
    """Inside the t1 arm the trainer's batch says every row was sampled at T=1 (the update
    before the temperature fix); outside it, each row's own temperature again."""
    learning = runpy.run_path(str(ROOT / "bench" / "learning.py"))  # not run as __main__
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    df = make_samples(tokenizer, [1.0, 0.0, 0.5, 0.5]).assign(temperature=0.7)
    with learning["scored_at_t1"]():
        assert collate(df, tokenizer.pad_token_id).temperature.tolist() == [1.0] * 4
    torch.testing.assert_close(
        collate(df, tokenizer.pad_token_id).temperature, torch.full((4,), 0.7)
    )


def test_learning_bench_real_model(bench, smollm2_dir, tmp_path):
    """bench/learning.py on the SmolLM2 recipe (LoRA warm start, one GRPO iteration): one
    state each to warm-start on, to play (twice: a group), to evaluate and to test on."""
    sets = smoke_args(
        *(f"model={smollm2_dir}", "games_per_iteration=2", "rollout.games_per_init=2"),
        *("game_init.num_val=1", "game_init.num_test=1", "warm_start.num_states=1"),
        *("train.mini_batch_size=2", "train.micro_batch_size=1"),
        "warm_start.train.micro_batch_size=1",
    )  # and SMOKE's short games: the smoke checks the path, not the play
    config = str(ROOT / "configs" / "pipeline-smollm2.yaml")
    results = bench.results("learning.py", "--config", config, *sets, "--out", str(tmp_path))
    assert list(results)[0] == "learning_gain" and abs(results["learning_gain"]) <= 1
    assert 0 <= results["real_test_reward"] <= 1  # one test state: its final score
    saved = json.loads((tmp_path / "learning.json").read_text())
    assert [row["iteration"] for row in saved["arms"]["recipe"]["0"]] == [-1, 0]


def test_engine_profile_rows_add_up_to_the_wall_time(bench, tiny_model_dir, tmp_path):
    """Prefill's own forwards and caches are listed under it, not counted twice: the top-level
    phases are disjoint calls inside the play, so their sum is at most the wall time; every
    decode step falls in one batch-size bucket and in the roofline, whose fraction is last."""
    lines = bench.output(
        "engine_profile.py",
        *("--model", str(tiny_model_dir), "--games", "4", "--max-turns", "2"),
        *("--max-new-tokens", "8", "--device", "cpu", "--out", str(tmp_path)),
        *("--copy-mib", "16"),
    )
    rows = jsonl(tmp_path / "engine_profile.jsonl")
    (run,) = [r for r in rows if r["row"] == "run"]
    assert run["games"] == 8 and run["states"] == 4  # each state played twice
    assert positive(run, "wall_s", "generate_calls", "generated_tokens", "prefilled_tokens")
    phases = {(r["parent"], r["phase"]): r for r in rows if r["row"] == "phase"}
    top = [r for (parent, _), r in phases.items() if parent == ""]
    inside = [r for (parent, _), r in phases.items() if parent == "_prefill"]
    assert len(top) == 7 and len(inside) == 3
    # attention runs inside the forwards: prefill's inside its forwards, decode's in the steps
    for parent, forwards in (
        ("_prefill", phases["_prefill", "_forward"]),
        ("", phases["", "_forward"]),
    ):
        attention = phases[parent or "_forward", "sdpa_gqa"]
        assert 0 < attention["seconds"] <= forwards["seconds"]
        assert attention["calls"] % forwards["calls"] == 0  # one call per layer per forward
    assert all(math.isfinite(r["seconds"]) and r["seconds"] >= 0 for r in phases.values())
    assert all(positive(r, "seconds", "calls") for r in top)
    assert sum(r["seconds"] for r in top) <= run["wall_s"] * (1 + 1e-9)
    assert phases["", "_prefill"]["calls"] == run["generate_calls"]  # one prefill per call
    decode = phases["", "_forward"]
    buckets = [r for r in rows if r["row"] == "decode_batch"]
    assert sum(r["steps"] for r in buckets) == decode["calls"]
    assert all(positive(r, "seconds", "steps", "ms_per_step") for r in buckets)
    results = dict(line.split()[1:] for line in lines if line.startswith("RESULT "))
    assert float(results["engine_decode_ms_per_step"]) == pytest.approx(
        decode["ms_per_call"], abs=5e-3
    )
    (roofline,) = [r for r in rows if r["row"] == "roofline"]
    assert roofline["steps"] == decode["calls"]
    assert roofline["measured_s"] == pytest.approx(decode["seconds"])
    assert positive(roofline, "bandwidth_gb_s", "weight_bytes", "kv_bytes", "floor_s", "fraction")
    # the floor is the bytes read over the bandwidth: every step reads the weights once
    moved = roofline["steps"] * roofline["weight_bytes"] + roofline["kv_bytes"]
    assert roofline["floor_s"] == pytest.approx(moved / (roofline["bandwidth_gb_s"] * 1e9))
    name, value = lines[-1].split()[1:]
    assert name == "decode_roofline_fraction"
    assert float(value) == pytest.approx(roofline["fraction"], abs=1e-4)


def test_engine_profile_counts_int8_weights_at_a_byte(tiny_model_dir):
    """The int8 engine's decode step reads each int8 layer's weights at a byte, not their fp32
    copy: the roofline's weight bytes drop by 3 bytes per weight of the quantized layers."""
    profile = runpy.run_path(str(ROOT / "bench" / "engine_profile.py"))  # not as __main__
    fp32 = hf.HFBackend(str(tiny_model_dir), device="cpu")
    int8 = hf.HFBackend(str(tiny_model_dir), device="cpu", quantize="int8")
    plain = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))  # before any packing
    linears = sum(m.weight.numel() for m in plain.modules() if isinstance(m, torch.nn.Linear))
    assert linears > 0 and isinstance(int8.model.lm_head, int8_linear.Int8Linear)
    assert profile["weight_bytes"](int8) == profile["weight_bytes"](fp32) - 3 * linears


MODEL_BENCHES = ("rollout.py", "learning.py", "train_memory.py", "engine_profile.py")


def test_model_benches_do_not_import_the_mlops_stack():
    """The benches a GPU machine runs need torch, transformers and verl, not MLflow or kfp (an
    H100 without them could not run `bench/rollout.py` while it imported the pipeline config).
    One interpreter loads each bench's `--help` in turn and lists what it pulled in."""
    code = "import runpy, sys\n"
    for script in MODEL_BENCHES:
        code += (
            f"sys.argv = [{script!r}, '--help']\n"
            "try:\n"
            f"    runpy.run_path({str(ROOT / 'bench' / script)!r}, run_name='__main__')\n"
            "except SystemExit:\n"
            "    pass\n"
            f"print('imported', {script!r}, sorted(m for m in ('mlflow', 'kfp') if m in sys.modules))\n"
        )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True
    )
    listed = [line for line in out.stdout.splitlines() if line.startswith("imported ")]
    assert listed == [f"imported {s} []" for s in MODEL_BENCHES]
