"""The plan of a run, fixed before it starts: which iterations run, how many games each plays,
and which earlier register each must wait for. `sparring.loop.runner.run_loop` follows it in one
process; the KFP graph (pipelines/selfplay.py) unrolls it into tasks."""

from __future__ import annotations

from typing import NamedTuple

from sparring.loop.config import PipelineConfig


class IterationPlan(NamedTuple):
    """What one iteration does, fixed before the run starts."""

    iteration: int
    games: int  # self-play games of its rollout
    after_register: int | None  # a `past-<k>` opponent: wait for this iteration's register
    moves_magnet: bool = False  # `magnet_every`: its trained model becomes the KL anchor


def plan(cfg: PipelineConfig) -> list[IterationPlan]:
    """The iterations of `cfg` in order. Rollout i of a pool with `past-<k>` opponents loads the
    checkpoint iteration i-k-1 registered (smallest k), so it must wait for that register. With
    `magnet_every` N, iterations N-1, 2N-1, ... (counted from iteration 0) move the magnet."""
    first, past, every = cfg.first_iteration, cfg.opponents.checkpoint_steps, cfg.magnet_every
    out = []
    for i in range(first, first + cfg.iterations):
        after = i - past[0] - 1 if past and i - past[0] - 1 >= first else None
        moves = bool(every) and (i + 1) % every == 0
        out.append(IterationPlan(i, cfg.games_per_iteration, after, moves))
    return out
