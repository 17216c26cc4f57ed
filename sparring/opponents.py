"""The opponent league of seed 001: who the learner plays in a rollout, and how hard.

Dynamic difficulty per role ("Dynamic Difficulty Adjustment"):

    schedule = DifficultySchedule(DifficultyConfig(pool=["hold", "random-legal", "greedy"]))
    plan, rows = plan_seats(len(inits), roles, schedule, selfplay_fraction=0.25, seed=iteration)
    names = sorted({name for seats in plan for name in seats})
    policies = build_policies(game, model, names, extra_models={"past-1": "runs/iter-3/model"})
    result = play(inits, policies, cfg, seat_plan=plan)
    schedule.update(iteration, learner_rewards(result.episodes))   # moves levels, logs rows

Each role has a level: an index into `pool`, ordered weakest to strongest opponent (e.g.
weak scripted agents < strong ones < earlier checkpoints). Once a role has `window` rewards since
its last move, their mean decides: above `raise_above` the level goes up one, below
`lower_below` it goes down one (clamped to the pool). A move clears that role's recent rewards
so the next decision uses episodes played against the new opponents only. The schedule is
pure (no I/O) and round-trips through `to_dict` / `from_dict` (JSON) so a pipeline can carry
it from one iteration to the next (sparring.loop.league).

Pool entries are policy names: the game's scripted agents (`Game.agents`) or earlier
checkpoints. The pipeline names earlier checkpoints relative to the learner: `past-<k>`
(k >= 1) is the policy that played the rollout k iterations before this one (`past_steps`).
A mixed game seats the learner in one role and the schedule's current opponent for that role
in every other seat. Learner roles of the mixed games cycle through the roles from a seeded
start, so they are balanced (counts differ by at most one), and every play of one initial
state shares its seating, so the `init` group key still compares like with like.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from sparring.games.base import LEARNER
from sparring.rollout import Episode


class DifficultyConfig(BaseModel):
    """How opponent strength follows each role's recent reward."""

    model_config = ConfigDict(extra="forbid")  # a misspelt field in a pipeline config fails

    pool: list[str] = Field(min_length=1)
    """Opponent names, weakest first (the game's scripted agents or `past-<k>` checkpoints)."""
    start_level: int = Field(0, ge=0)
    """Index into `pool` every role starts at."""
    window: int = Field(10, ge=1)
    """Recent episodes averaged per decision."""
    raise_above: float = 0.25
    """Mean reward above which the role faces stronger opponents (the defaults suit a reward
    where a seat starts near 0.2; tune both thresholds to your game's reward scale)."""
    lower_below: float = 0.15
    """Mean reward below which the role faces weaker opponents."""
    draw: Literal["level", "uniform"] = "level"
    """How a state's opponent is picked: `level`, its role's level (the schedule above);
    `uniform`, a seeded draw from the whole pool per state, a fixed mixture (e.g. a best
    response beside a random player, which reaches the states the best response avoids).
    Under `uniform` the levels stay at `start_level`."""

    @model_validator(mode="after")
    def _check(self) -> DifficultyConfig:
        if self.start_level >= len(self.pool):
            raise ValueError(f"start_level {self.start_level} is outside pool {self.pool}")
        if self.lower_below > self.raise_above:
            raise ValueError(
                f"lower_below ({self.lower_below}) must not exceed raise_above ({self.raise_above})"
            )
        return self


class DifficultySchedule:
    """Per-role opponent levels that move with recent mean reward."""

    def __init__(self, cfg: DifficultyConfig) -> None:
        self.cfg = cfg
        self.levels: dict[str, int] = {}
        self.recent: dict[str, list[float]] = {}
        self.history: list[dict[str, Any]] = []
        """One row per (update, role): iteration, role, mean_reward, level, opponent,
        change (+1, -1 or 0)."""

    def level(self, role: str) -> int:
        return self.levels.get(role, self.cfg.start_level)

    def update(self, iteration: int, rewards: dict[str, list[float]]) -> dict[str, int]:
        """Add each role's new episode rewards; move levels; return the changes made."""
        changes = {}
        for role in sorted(rewards):
            recent = (self.recent.get(role, []) + list(rewards[role]))[-self.cfg.window :]
            self.recent[role] = recent
            mean = sum(recent) / len(recent) if recent else None
            change = 0
            if mean is not None and len(recent) >= self.cfg.window and self.cfg.draw == "level":
                change = (mean > self.cfg.raise_above) - (mean < self.cfg.lower_below)
            new = min(max(self.level(role) + change, 0), len(self.cfg.pool) - 1)
            change = new - self.level(role)
            if change:
                self.levels[role] = new
                self.recent[role] = []
                changes[role] = change
            self.history.append(
                {
                    "iteration": iteration,
                    "role": role,
                    "mean_reward": mean,
                    "level": new,
                    "opponent": self.cfg.pool[new],
                    "change": change,
                }
            )
        return changes

    def metrics(self) -> dict[str, float]:
        """`difficulty/<role>` = current level, for MLflow."""
        seen = sorted(set(self.recent) | set(self.levels))
        return {f"difficulty/{c}": float(self.level(c)) for c in seen}

    def to_dict(self) -> dict[str, Any]:
        return {
            "cfg": self.cfg.model_dump(),
            "levels": self.levels,
            "recent": self.recent,
            "history": self.history,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DifficultySchedule:
        schedule = cls(DifficultyConfig(**data["cfg"]))
        schedule.levels = dict(data["levels"])
        schedule.recent = {c: list(r) for c, r in data["recent"].items()}
        schedule.history = list(data["history"])
        return schedule


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
    learner: str = LEARNER,
) -> tuple[list[list[str]], list[dict[str, Any]]]:
    """The `seat_plan` of `play` for `num_inits` initial states, and one log row per state.

    `selfplay_fraction` of the states (rounded, drawn with `seed`) seat `learner` everywhere;
    the rest seat it in one role against that role's scheduled opponent (or, under
    `draw: uniform`, one drawn from the pool with `seed` per state). A row holds
    `init_index`, `mode` ("selfplay" or "vs_pool"), `learner_role`, `level`, `opponent`.
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
                    "learner_role": None,
                    "level": None,
                    "opponent": learner,
                }
            )
            continue
        seat = (start + mixed) % len(roles)
        mixed += 1
        role, pool = roles[seat], schedule.cfg.pool
        level = rng.randrange(len(pool)) if schedule.cfg.draw == "uniform" else schedule.level(role)
        plan.append([learner if s == seat else pool[level] for s in range(len(roles))])
        rows.append(
            {
                "init_index": i,
                "mode": "vs_pool",
                "learner_role": role,
                "level": level,
                "opponent": pool[level],
            }
        )
    return plan, rows


def learner_rewards(episodes: Sequence[Episode], learner: str = LEARNER) -> dict[str, list[float]]:
    """The learner's reward per role, from games where it held exactly one seat (self-play
    games say nothing about opponent strength); the input of `DifficultySchedule.update`."""
    out: dict[str, list[float]] = {}
    for ep in episodes:
        seats = [s for s, name in enumerate(ep.seat_policies) if name == learner]
        if len(seats) == 1:
            out.setdefault(ep.roles[seats[0]], []).append(ep.rewards[seats[0]])
    return out
