"""Dynamic difficulty per country (seed 001, "Dynamic Difficulty Adjustment").

    schedule = DifficultySchedule(DifficultyConfig(pool=["hold", "random-legal", "greedy"]))
    for iteration in range(n):
        opponents = {c: schedule.opponent(c) for c in countries}    # seat the learner vs these
        ...play, collect each country's rewards...
        schedule.update(iteration, rewards_by_country)              # moves levels, logs rows
    schedule.history                                                 # the loggable schedule

Each country has a level: an index into `pool`, ordered weakest to strongest opponent (e.g.
hold < random-legal < greedy < earlier checkpoints). Once a country has `window` rewards
since its last move, their mean decides: above `raise_above` the level goes up one, below
`lower_below` it goes down one (clamped to the pool). A move clears that country's recent
rewards so the next decision uses episodes played against the new opponents only.
The schedule is pure (no I/O) and round-trips through `to_dict` / `from_dict` (JSON) so a
pipeline can carry it from one iteration to the next.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator


class DifficultyConfig(BaseModel):
    """How opponent strength follows each country's recent reward."""

    model_config = ConfigDict(extra="forbid")  # a misspelt field in a pipeline config fails

    pool: list[str] = Field(default_factory=lambda: ["hold", "random-legal", "greedy"])
    """Opponent names, weakest first (scripted agents or checkpoint names)."""
    start_level: int = Field(0, ge=0)
    """Index into `pool` every country starts at."""
    window: int = Field(10, ge=1)
    """Recent episodes averaged per decision."""
    raise_above: float = 0.25
    """Mean reward above which the country faces stronger opponents. The defaults suit the
    Diplomacy centers/18 reward: 0.25 = 4.5 centers, 0.15 = 2.7 (a power starts with 3-4)."""
    lower_below: float = 0.15
    """Mean reward below which the country faces weaker opponents."""

    @model_validator(mode="after")
    def _check(self) -> DifficultyConfig:
        if not self.pool:
            raise ValueError("pool must list at least one opponent")
        if self.start_level >= len(self.pool):
            raise ValueError(f"start_level {self.start_level} is outside pool {self.pool}")
        if self.lower_below > self.raise_above:
            raise ValueError(
                f"lower_below ({self.lower_below}) must not exceed raise_above ({self.raise_above})"
            )
        return self


class DifficultySchedule:
    """Per-country opponent levels that move with recent mean reward."""

    def __init__(self, cfg: DifficultyConfig | None = None) -> None:
        self.cfg = cfg or DifficultyConfig()
        self.levels: dict[str, int] = {}
        self.recent: dict[str, list[float]] = {}
        self.history: list[dict[str, Any]] = []
        """One row per (update, country): iteration, country, mean_reward, level, opponent,
        change (+1, -1 or 0)."""

    def level(self, country: str) -> int:
        return self.levels.get(country, self.cfg.start_level)

    def opponent(self, country: str) -> str:
        """The pool entry `country`'s learner plays against now."""
        return self.cfg.pool[self.level(country)]

    def update(self, iteration: int, rewards: dict[str, list[float]]) -> dict[str, int]:
        """Add each country's new episode rewards; move levels; return the changes made."""
        changes = {}
        for country in sorted(rewards):
            recent = (self.recent.get(country, []) + list(rewards[country]))[-self.cfg.window :]
            self.recent[country] = recent
            mean = sum(recent) / len(recent) if recent else None
            change = 0
            if mean is not None and len(recent) >= self.cfg.window:
                change = (mean > self.cfg.raise_above) - (mean < self.cfg.lower_below)
            new = min(max(self.level(country) + change, 0), len(self.cfg.pool) - 1)
            change = new - self.level(country)
            if change:
                self.levels[country] = new
                self.recent[country] = []
                changes[country] = change
            self.history.append(
                {
                    "iteration": iteration,
                    "country": country,
                    "mean_reward": mean,
                    "level": new,
                    "opponent": self.cfg.pool[new],
                    "change": change,
                }
            )
        return changes

    def metrics(self) -> dict[str, float]:
        """`difficulty/<country>` = current level, for MLflow."""
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
