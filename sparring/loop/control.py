"""The SFT control: each GRPO iteration's budget spent on more SFT from the teacher instead.

    grpo = run_loop(cfg, "runs/grpo")
    sft = run_loop(control_config(cfg, [it.metrics for it in grpo.iterations]), "runs/sft")
    print(format_comparison({0: compare("runs/grpo", "runs/sft")}, cfg.champion_metric))

With `sft_control` set, `run_loop` replaces each iteration's rollout and GRPO update by
`sft_round`: the warm start's teacher plays the iteration's train states (those its rollout
would play) once each, and the model is fine-tuned on those games by the warm start's own step
(`sparring.loop.steps.warm_start`, with `warm_start.train`) for the GRPO update's number of
optimizer steps, or, budgeted in wall time, for as many as fit in the GRPO iteration's rollout
and update seconds. The rest is the GRPO run's: the warm start, the val and test states, the
evaluation's draws; so the two final models compare game by game (`compare`).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Literal

import numpy as np

from sparring.loop import steps, tasks
from sparring.loop.config import PipelineConfig
from sparring.stats import mean_se, paired_gain

Budget = Literal["steps", "wall"]
# What a GRPO iteration spent: its optimizer steps, or the seconds it played and trained.
STEPS, WALL = ("train/optimizer_steps",), ("perf/rollout_seconds", "perf/train_seconds")


def control_config(
    cfg: PipelineConfig,
    grpo_metrics: list[dict[str, float]],
    by: Budget = "steps",
    lr: float | None = None,
) -> PipelineConfig:
    """`cfg` as the SFT control of the GRPO run whose iterations' metrics are `grpo_metrics`:
    each iteration gets the same optimizer steps (`by="steps"`; 0 where GRPO had no signal)
    or the same seconds (`by="wall"`), at learning rate `lr` (None: the warm start's)."""
    spent = [sum(m.get(k, 0.0) for k in (STEPS if by == "steps" else WALL)) for m in grpo_metrics]
    control = {"steps": [round(s) for s in spent]} if by == "steps" else {"seconds": spent}
    control |= {"lr": lr} if lr else {}
    data = cfg.model_dump(mode="json", exclude_unset=True)
    return PipelineConfig.model_validate(data | {"sft_control": control})


def sft_round(
    cfg: PipelineConfig, model_dir: str, train_inits: str, iteration: int, games: int, out_dir: Path
) -> dict[str, float]:
    """One iteration of the control: the teacher's games of `iteration`'s train states, SFT on
    them for the iteration's budget; a checkpoint in `out_dir` (a copy of `model_dir` for a
    budget of 0 steps) and its metrics (`train/optimizer_steps`, `perf/train_seconds`,
    `warm_start/teacher_reward`, ...)."""
    control, ws = cfg.sft_control, cfg.warm_start
    assert control is not None and ws is not None and ws.agent is not None  # the recipe checks
    budget = control.budget[iteration - cfg.first_iteration]
    n = round(budget / seconds_per_step(model_dir)) if control.seconds else int(budget)
    if n == 0:
        shutil.copytree(model_dir, out_dir, dirs_exist_ok=True)
        return {"train/optimizer_steps": 0.0, "perf/train_seconds": 0.0}
    states, rcfg = tasks.iteration_plan(cfg, train_inits, iteration, games)
    sft_cfg = ws.train.model_copy(update={"steps": n, "lr": control.lr or ws.train.lr})
    return steps.warm_start(model_dir, rcfg, ws.agent, states, out_dir, sft_cfg, cfg.device).metrics


def seconds_per_step(model_dir: str | Path) -> float:
    """The optimizer's seconds per step in the SFT that wrote `model_dir` (its metrics.json)."""
    metrics = json.loads((Path(model_dir) / "metrics.json").read_text())
    return metrics["perf/train_seconds"] / metrics["train/optimizer_steps"]


def scores_on_test(work: str | Path) -> dict[str, dict[str, float]]:
    """The start's and the final model's score per test game of the run in `work`
    (`run_loop`'s test step: test/test.json)."""
    return json.loads((Path(work) / "test" / "test.json").read_text())["scores"]


def final_difference(work: str | Path, other: str | Path) -> tuple[float, float]:
    """The final model of the run in `work` minus that of the run in `other` on the test games
    both played, game by game: the mean and its paired standard error."""
    return paired_gain(scores_on_test(other)["final"], scores_on_test(work)["final"])


def compare(grpo_work: str | Path, sft_work: str | Path) -> dict[str, float]:
    """One training seed's GRPO run and its SFT control on the test games: each arm's mean
    start and final score and its gain, and `grpo_minus_sft` with its paired standard error
    (GRPO's final score minus the control's, game by game)."""
    grpo, sft = scores_on_test(grpo_work), scores_on_test(sft_work)
    diff, se = final_difference(grpo_work, sft_work)
    figures = {"grpo_minus_sft": diff, "grpo_minus_sft_se": se}
    for arm, scores in (("grpo", grpo), ("sft", sft)):
        figures[f"{arm}_start"] = float(np.mean(list(scores["start"].values())))
        figures[f"{arm}_final"] = float(np.mean(list(scores["final"].values())))
        figures[f"{arm}_gain"] = paired_gain(scores["start"], scores["final"])[0]
    return figures


def format_comparison(per_seed: dict[int, dict[str, float]], metric: str) -> str:
    """The table of `compare` per training seed, side by side, then the mean and its standard
    error across the seeds."""
    cols = ("grpo_start", "grpo_final", "sft_final", "grpo_gain", "sft_gain", "grpo_minus_sft")
    lines = [
        f"test {metric}: GRPO and the SFT control per training seed (same warm start and games)",
        f"{'seed':>6}  {'start':>6}  {'grpo':>6}  {'sft':>6}  {'grpo gain':>9}  {'sft gain':>8}  "
        f"{'grpo-sft':>8}  {'paired s.e.':>11}",
    ]

    def row(name: str, f: dict[str, float], se: str) -> str:
        start, grpo, sft, g_gain, s_gain, diff = (f[c] for c in cols)
        return (
            f"{name:>6}  {start:>6.3f}  {grpo:>6.3f}  {sft:>6.3f}  {g_gain:>+9.3f}  "
            f"{s_gain:>+8.3f}  {diff:>+8.3f}  {se:>11}"
        )

    for seed, f in per_seed.items():
        lines.append(row(str(seed), f, f"{f['grpo_minus_sft_se']:.3f}"))
        if f["sft_start"] != f["grpo_start"]:
            lines.append(f"{'':>6}  (the control's start scored {f['sft_start']:.3f})")
    across = {c: mean_se([f[c] for f in per_seed.values()]) for c in cols}
    lines.append(row("mean", {c: m for c, (m, _) in across.items()}, ""))
    lines.append(row("s.e.", {c: se for c, (_, se) in across.items()}, "(across seeds)"))
    return "\n".join(lines)
