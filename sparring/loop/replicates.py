"""Training-seed replicates: one recipe run once per training seed, and what the seeds agree on.

    runs = [Replicate(s, name, run_loop(seeded(cfg, s), work / str(s)).test) for s in (0, 1, 2)]
    summary = summarize(runs)          # per seed, and the mean with its s.e. across seeds
    print(format_replicates(summary))

An evaluation's standard error says how much a score would move on other test games; the
standard error across seeds says how much it would move with another training run. The
summary gives both for the test gain, so a reader sees which one dominates.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from sparring.loop.config import PipelineConfig
from sparring.metrics import GAIN_OVER_BEST_TRIVIAL, TEST, metric_name
from sparring.stats import mean_se

SEED_STRIDE = 1000  # a training seed moves the rollout's sampling seed by this much
TRIVIAL = metric_name(TEST, GAIN_OVER_BEST_TRIVIAL)


class Replicate(NamedTuple):
    """One training seed's run."""

    seed: int
    run_name: str
    # test/start, test/final, test/gain, test/gain_se, test/gain_over_best_trivial, ...
    # (tasks.evaluate_test)
    test: dict[str, float]


def seeded(cfg: PipelineConfig, seed: int) -> PipelineConfig:
    """`cfg` for training seed `seed`: the rollout samples with `SEED_STRIDE * seed` added to
    its seed, and GRPO and the SFTs of the warm start and the average use `seed`; the states
    and the evaluation's draws stay the same, so the seeds' figures are comparable game by
    game."""
    data = cfg.model_dump(mode="json", exclude_unset=True)
    sampling = data.setdefault("rollout", {}).setdefault("sampling", {})
    sampling["seed"] = (cfg.rollout.sampling.seed or 0) + SEED_STRIDE * seed
    data.setdefault("train", {})["seed"] = seed
    for section in ("warm_start", "average"):
        if data.get(section) is not None:
            data[section].setdefault("train", {})["seed"] = seed
    return PipelineConfig.model_validate(data)


def summarize(replicates: list[Replicate]) -> dict[str, Any]:
    """Per seed its test figures; across seeds the mean and standard error of each (the gain
    over the best trivial baseline too, where every seed has one), and the mean evaluation
    (paired) standard error of the gain beside them."""
    figures = ("test/start", "test/final", "test/gain")
    if all(TRIVIAL in r.test for r in replicates):
        figures += (TRIVIAL,)
    across = {k: mean_se([r.test[k] for r in replicates]) for k in figures}
    eval_se = float(np.mean([r.test["test/gain_se"] for r in replicates]))
    return {
        "seeds": {r.seed: {"run_name": r.run_name, **r.test} for r in replicates},
        "mean": {k: m for k, (m, _) in across.items()},
        "se_seeds": {k: se for k, (_, se) in across.items()},
        "gain_se_eval": eval_se,
    }


def format_replicates(summary: dict[str, Any], metric: str) -> str:
    """The table of `summarize`: one row per seed, then the mean ± s.e. across seeds."""
    mean, se = summary["mean"], summary["se_seeds"]
    trivial = TRIVIAL in mean  # the final model minus the best trivial baseline, on test

    def over(t: dict[str, float], sign: str = "+") -> str:
        return f"  {t[TRIVIAL]:>{sign}12.3f}" if trivial else ""

    lines = [
        f"test {metric} per training seed (gain: final - start, paired on the test games)",
        f"{'seed':>6}  {'start':>6}  {'final':>6}  {'gain':>7}  {'eval s.e.':>9}"
        + ("  over trivial" if trivial else "")
        + "  run",
    ]
    for seed, t in summary["seeds"].items():
        lines.append(
            f"{seed:>6}  {t['test/start']:>6.3f}  {t['test/final']:>6.3f}  "
            f"{t['test/gain']:>+7.3f}  {t['test/gain_se']:>9.3f}{over(t)}  {t['run_name']}"
        )
    lines += [
        f"{'mean':>6}  {mean['test/start']:>6.3f}  {mean['test/final']:>6.3f}  "
        f"{mean['test/gain']:>+7.3f}  {summary['gain_se_eval']:>9.3f}{over(mean)}",
        f"{'s.e.':>6}  {se['test/start']:>6.3f}  {se['test/final']:>6.3f}  "
        f"{se['test/gain']:>7.3f}  {'':>9}{over(se, '')}  (across {len(summary['seeds'])} seeds)",
    ]
    return "\n".join(lines)
