"""The metric vocabulary: every metric Sparring logs is named in one of these namespaces.

    rollout/<metric>               a rollout, over the learner's seats (`sparring.rollout`)
    train/<metric>                 the GRPO or SFT update (`sparring.train`, `sparring.sft`)
    perf/<metric>                  seconds, tokens and calls of any stage
    eval/<mode>/<role>/<metric>    one evaluation mode, per role the learner played, and over
    eval/<mode>/all/<metric>       all its roles (`sparring.evaluate`)
    eval/baseline/<name>           a game's baseline policy on the same states (`Game.baselines`)
    eval/gain_over_best_trivial    the model's reward minus the best trivial baseline's
    warm_start/<metric>            the warm start's teacher (`sparring.loop`)
    population/<member>/<metric>   a population member's rating, rollout reward, and its own
                                   train/* and eval/* (`sparring.loop.population`)
    test/<figure>                  the start and the final model once on the test states, in
                                   the champion metric: start, final, gain, gain_se (paired);
                                   test/baseline/<name> and test/gain_over_best_trivial there

Generic metrics are the same for every game; a game adds its own (`Game.episode_metrics`)
inside the same namespaces. Eval modes are `EVAL_MODES` plus any a game's lineups add
(`Game.eval_lineups`).
"""

from __future__ import annotations

ROLLOUT, TRAIN, PERF, EVAL, WARM_START = "rollout", "train", "perf", "eval", "warm_start"
POPULATION = "population"
TEST = "test"
ALL_ROLES = "all"
"""The role segment of an eval metric taken over every role the learner played."""
BASELINE, GAIN_OVER_BEST_TRIVIAL = "baseline", "gain_over_best_trivial"
SELFPLAY, VS_PREVIOUS, VS_SCRIPTED = "selfplay", "vs_previous", "vs_scripted"
EVAL_MODES = (SELFPLAY, VS_PREVIOUS, VS_SCRIPTED)
"""The modes an evaluation can be asked for."""


def metric_name(*parts: str) -> str:
    """A metric name from its segments: `metric_name(PERF, "eval_seconds")` = "perf/eval_seconds"."""
    return "/".join(parts)


def eval_name(mode: str, role: str, metric: str) -> str:
    """`eval/<mode>/<role>/<metric>`."""
    return metric_name(EVAL, mode, role, metric)


def baseline_name(name: str) -> str:
    """`eval/baseline/<name>`: a baseline's mean normalized reward."""
    return metric_name(EVAL, BASELINE, name)


def split_baseline(metric: str) -> str | None:
    """The name of an `eval/baseline/<name>` metric; None for other names (and its `_se`)."""
    prefix = baseline_name("")
    if not metric.startswith(prefix) or metric.endswith("_se"):
        return None
    return metric.removeprefix(prefix)


def prefixed(prefix: str, metrics: dict[str, float]) -> dict[str, float]:
    """`metrics` with every name under `prefix` (a namespace or a deeper path)."""
    return {metric_name(prefix, k): v for k, v in metrics.items()}


def split_eval(metric: str) -> tuple[str, str, str] | None:
    """(mode, role, metric) of an `eval/<mode>/<role>/<metric>` name; None for other names."""
    parts = metric.split("/")
    if len(parts) != 4 or parts[0] != EVAL:
        return None
    return parts[1], parts[2], parts[3]
