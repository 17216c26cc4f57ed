"""A population of policies trained at once, each responsible for some roles (seed 001's
country specialists), rated against each other, the weakest replaced by the strongest.

    cfg = PopulationConfig(size=2, roles=[["player_a"], ["player_b"]], replace_every=2)
    population = Population(cfg)                 # or Population.from_dict(saved)
    sources = population.replace(iteration)      # member -> the member whose weights it takes
    plan = plan_seats(len(inits), roles, cfg, seed=iteration)
    result = play(inits, policies, rcfg, seat_plan=plan)   # one policy per member name
    population.update(iteration, result.episodes)          # ratings from the games

Members are named `member-<k>` (`member_names`); a member plays only the roles of its set
(`roles[k]`, or every role without `roles`). Each initial state is seated once, for all its
plays: every seat draws one of the members that may play its role, the one with the fewest
seats so far in the rollout (ties drawn with the seed), so members play equally often and
most games mix members.

Ratings: OpenSkill's Plackett-Luce model (mu 25, sigma 25/3 to start). A game that seats two
or more members is one rating event: each member is a team of one, scored by the mean reward
of its seats in that game, so the member whose seats earned more wins (equal scores draw: in
a cooperative game with a shared reward every game is a draw and the ratings only tighten).
A member's strength is its ordinal, mu - 3 sigma. Every `replace_every` iterations (before
rollouts replace_every, 2 * replace_every, ...) the weakest member takes a copy of the
strongest's weights and rating, keeping its own roles (population-based training's exploit
step), unless no member is rated above it.

The state is pure (no I/O) and round-trips through `to_dict` / `from_dict` (JSON), so the
loop carries it from one rollout to the next (sparring.loop.population), like the opponent
schedule.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from sparring.rollout import Episode

MEMBER_PREFIX = "member-"
MU, SIGMA = 25.0, 25.0 / 3  # OpenSkill's defaults: a new member's rating


def member_names(size: int) -> list[str]:
    """The seat policy names of a population of `size`: member-0 … member-<size-1>."""
    return [f"{MEMBER_PREFIX}{k}" for k in range(size)]


class PopulationConfig(BaseModel):
    """A population of `size` policies trained together (sparring.population)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    size: int = Field(ge=1)
    """Members, each a checkpoint of its own trained on the seats it played."""
    roles: list[list[str]] | None = None
    """The roles each member plays (one list per member, together covering every role of the
    game); None = every member plays every role."""
    replace_every: int = Field(0, ge=0)
    """Iterations between replacements of the weakest member by a copy of the strongest
    (before rollouts replace_every, 2 * replace_every, ...); 0 = never."""

    @model_validator(mode="after")
    def _check(self) -> PopulationConfig:
        if self.roles is not None:
            if len(self.roles) != self.size:
                raise ValueError(
                    f"population.roles has {len(self.roles)} role sets for {self.size} members: "
                    "give one list of roles per member, or none (every member plays every role)"
                )
            if not all(self.roles):
                raise ValueError("population.roles: every member needs at least one role")
        return self

    @property
    def members(self) -> list[str]:
        return member_names(self.size)

    def check_roles(self, game_roles: Sequence[str]) -> None:
        """ValueError unless the role sets name only `game_roles` and cover each of them."""
        if self.roles is None:
            return
        named = {r for roles in self.roles for r in roles}
        unknown, uncovered = (
            sorted(named - set(game_roles)),
            [r for r in game_roles if r not in named],
        )
        if unknown or uncovered:
            raise ValueError(
                f"population.roles must name the game's roles {list(game_roles)} and cover each: "
                f"unknown {unknown}, played by no member {uncovered}"
            )

    def players(self, role: str) -> list[str]:
        """The members that may play `role`."""
        if self.roles is None:
            return self.members
        return [m for m, roles in zip(self.members, self.roles, strict=True) if role in roles]


def plan_seats(
    num_inits: int, roles: Sequence[str], cfg: PopulationConfig, seed: int = 0
) -> list[list[str]]:
    """The `seat_plan` of `play`: a member per seat for each of `num_inits` initial states,
    each seat the least-seated member that may play its role (ties drawn with `seed`)."""
    rng, seated = random.Random(seed), Counter[str]()
    plan = []
    for _ in range(num_inits):
        row = []
        for role in roles:
            players = cfg.players(role)
            fewest = min(seated[m] for m in players)
            member = rng.choice([m for m in players if seated[m] == fewest])
            seated[member] += 1
            row.append(member)
        plan.append(row)
    return plan


def game_scores(episode: Episode, members: Sequence[str]) -> dict[str, float]:
    """The mean reward of each member's seats in one game (members seated there only)."""
    rewards: dict[str, list[float]] = {}
    for name, reward in zip(episode.seat_policies, episode.rewards, strict=True):
        if name in members:
            rewards.setdefault(name, []).append(reward)
    return {m: sum(r) / len(r) for m, r in rewards.items()}


class Population:
    """The members' ratings, replacements and history."""

    def __init__(self, cfg: PopulationConfig) -> None:
        self.cfg = cfg
        self.ratings: dict[str, list[float]] = {m: [MU, SIGMA] for m in cfg.members}
        """member -> [mu, sigma]."""
        self.history: list[dict[str, Any]] = []
        """One row per update (iteration, games rated, each member's mu, sigma and ordinal)
        and per replacement (iteration, replaced, by)."""

    def ordinal(self, member: str) -> float:
        """The member's conservative strength, mu - 3 sigma."""
        mu, sigma = self.ratings[member]
        return mu - 3 * sigma

    def ranking(self) -> list[str]:
        """Members, strongest first (ties in name order)."""
        return sorted(self.cfg.members, key=lambda m: (-self.ordinal(m), m))

    def replace(self, iteration: int) -> dict[str, str]:
        """At a replacement iteration, the weakest member takes the strongest's rating;
        returns {weakest: strongest} (whose weights it must take), else {}."""
        every = self.cfg.replace_every
        if not every or iteration == 0 or iteration % every or self.cfg.size < 2:
            return {}
        ranked = self.ranking()
        strongest, weakest = ranked[0], ranked[-1]
        if self.ordinal(strongest) <= self.ordinal(weakest):
            return {}
        self.ratings[weakest] = list(self.ratings[strongest])
        self.history.append({"iteration": iteration, "replaced": weakest, "by": strongest})
        return {weakest: strongest}

    def update(self, iteration: int, episodes: Sequence[Episode]) -> int:
        """Rate every game of `episodes` that seats two members or more, in play order;
        returns how many were rated."""
        from openskill.models import PlackettLuce

        model, rated = PlackettLuce(), 0
        for episode in episodes:
            scores = game_scores(episode, self.cfg.members)
            if len(scores) < 2:
                continue
            names = sorted(scores)
            teams = [[model.rating(*self.ratings[m], name=m)] for m in names]
            new = model.rate(teams, scores=[scores[m] for m in names])
            for m, (r,) in zip(names, new, strict=True):
                self.ratings[m] = [r.mu, r.sigma]
            rated += 1
        row = {"iteration": iteration, "games_rated": rated}
        for m in self.cfg.members:
            row[m] = {"mu": self.ratings[m][0], "sigma": self.ratings[m][1]}
            row[m]["ordinal"] = self.ordinal(m)
        self.history.append(row)
        return rated

    def metrics(self) -> dict[str, float]:
        """`population/<member>/{rating,mu,sigma}` (rating = the ordinal), for MLflow."""
        out = {}
        for m, (mu, sigma) in self.ratings.items():
            out |= {f"population/{m}/rating": self.ordinal(m), f"population/{m}/mu": mu}
            out[f"population/{m}/sigma"] = sigma
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"cfg": self.cfg.model_dump(), "ratings": self.ratings, "history": self.history}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Population:
        population = cls(PopulationConfig(**data["cfg"]))
        population.ratings = {m: list(r) for m, r in data["ratings"].items()}
        population.history = list(data["history"])
        return population
