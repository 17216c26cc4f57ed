"""Opponent mix of a rollout batch (seed 001): pure self-play, or the learner in one seat
against opponents whose strength follows each country's `DifficultySchedule`.

    schedule = DifficultySchedule(DifficultyConfig(pool=["hold", "random-legal", "greedy", "iter-3"]))
    plan, rows = plan_seats(len(inits), ROLES, schedule, selfplay_fraction=0.25, seed=iteration)
    names = sorted({name for seats in plan for name in seats})
    policies = build_policies(model, names, extra_models={"iter-3": "runs/iter-3/model"})
    result = play(inits, policies, cfg, seat_plan=plan)
    schedule.update(iteration, learner_rewards(result.episodes))   # moves levels, logs rows

Pool entries are policy names: scripted agents (`sparring.agents`) or earlier checkpoints
(keys of `build_policies`' `extra_models`). The pipeline names earlier checkpoints relative to
the learner: `past-<k>` (k >= 1) is the policy that played the rollout k iterations before
this one (`past_steps`; sparring.steps resolves it to a stored checkpoint). A mixed game
seats the learner in one country and the schedule's current opponent for that country in
every other seat. Learner countries of the mixed games cycle through the roles from a seeded
start, so they are balanced (counts differ by at most one), and every play of one initial
state shares its seating, so the `init` group key still compares like with like.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from typing import Any

from sparring.curriculum import DifficultySchedule
from sparring.rollout import Episode

_PAST = re.compile(r"past-([1-9][0-9]*)")


def past_steps(name: str) -> int | None:
    """k of a `past-<k>` pool entry (k >= 1: the learner's policy k iterations ago), else None."""
    match = _PAST.fullmatch(name)
    return int(match.group(1)) if match else None


def plan_seats(
    num_inits: int,
    roles: Sequence[str],
    schedule: DifficultySchedule,
    selfplay_fraction: float = 0.0,
    seed: int = 0,
    learner: str = "policy",
) -> tuple[list[list[str]], list[dict[str, Any]]]:
    """The `seat_plan` of `play` for `num_inits` initial states, and one log row per state.

    `selfplay_fraction` of the states (rounded, drawn with `seed`) seat `learner` everywhere;
    the rest seat it in one country against that country's scheduled opponent. A row holds
    `init_index`, `mode` ("selfplay" or "vs_pool"), `learner_country`, `level`, `opponent`.
    """
    if not 0.0 <= selfplay_fraction <= 1.0:
        raise ValueError(f"selfplay_fraction must be in [0, 1], got {selfplay_fraction}")
    if learner in schedule.cfg.pool:
        raise ValueError(f"the learner {learner!r} can't also be a pool opponent")
    rng = random.Random(seed)
    selfplay = set(rng.sample(range(num_inits), round(num_inits * selfplay_fraction)))
    start = rng.randrange(len(roles))
    plan: list[list[str]] = []
    rows: list[dict[str, Any]] = []
    mixed = 0  # mixed games seated so far
    for i in range(num_inits):
        if i in selfplay:
            plan.append([learner] * len(roles))
            rows.append(
                {
                    "init_index": i,
                    "mode": "selfplay",
                    "learner_country": None,
                    "level": None,
                    "opponent": learner,
                }
            )
            continue
        seat = (start + mixed) % len(roles)
        mixed += 1
        country, opponent = roles[seat], schedule.opponent(roles[seat])
        plan.append([learner if s == seat else opponent for s in range(len(roles))])
        rows.append(
            {
                "init_index": i,
                "mode": "vs_pool",
                "learner_country": country,
                "level": schedule.level(country),
                "opponent": opponent,
            }
        )
    return plan, rows


def learner_rewards(episodes: Sequence[Episode], learner: str = "policy") -> dict[str, list[float]]:
    """The learner's reward per country, from games where it held exactly one seat (self-play
    games say nothing about opponent strength); the input of `DifficultySchedule.update`."""
    out: dict[str, list[float]] = {}
    for ep in episodes:
        seats = [s for s, name in enumerate(ep.seat_policies) if name == learner]
        if len(seats) == 1:
            out.setdefault(ep.roles[seats[0]], []).append(ep.rewards[seats[0]])
    return out
