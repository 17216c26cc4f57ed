"""Means with their standard errors: an evaluation's, a paired comparison's, over seeds.

    mean, se = mean_se([0.5, 0.7, 0.6])                  # 0.6, 0.0577
    gain, se = paired_gain(start={"a": .5, "b": .4}, end={"a": .7, "b": .5})   # 0.15, 0.05

A paired comparison scores two policies on the same games and takes the standard error of
the per-game differences: the games' own difficulty cancels, so it is far smaller than the
two scores' standard errors combined.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np


def mean_se(values: Sequence[float]) -> tuple[float, float]:
    """Mean and standard error (s.d. with ddof=1 over sqrt(n)); the s.e. is nan below 2 values."""
    x = np.asarray(values, dtype=float)
    se = float(x.std(ddof=1) / np.sqrt(len(x))) if len(x) > 1 else float("nan")
    return float(x.mean()), se


def paired_gain(start: Mapping[str, float], end: Mapping[str, float]) -> tuple[float, float]:
    """Mean and standard error of `end - start` over the games both scored (keyed by game id).
    ValueError when they share no game: there is nothing to pair."""
    common = sorted(start.keys() & end.keys())
    if not common:
        raise ValueError("the two evaluations share no game: their scores can't be paired")
    return mean_se([end[g] - start[g] for g in common])
