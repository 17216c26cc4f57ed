"""The strategic evaluator (seed 001): a policy on dedicated scenario sets, per dimension and
country.

    cfg = StrategicConfig(scenarios=8)
    sets = scenario_sets(cfg)                  # {dimension: [scenario states]}
    metrics = evaluate_strategic(policy, sets, play_games, game, sampling, cfg.opponent_bot)
    metrics["strategic/crisis/AUSTRIA/center_gain"]

Scenario sets come from real play: seeded trajectories of scripted bots (each power `greedy`,
`random-legal` or `support`, drawn per trajectory) from the standard start, one spring
position per trajectory, dimension and power at most (a seeded draw among the springs that
qualify), until every power has `scenarios` positions in every dimension:

    opening   springs 1901-1903 (1901 once: the standard start)
    midgame   springs 1904-1908 where the power is strong: at least 5 centers and at least
              the third-largest holding
    endgame   springs 1909-1912, strong as above
    crisis    springs 1902-1912 where the power holds two or more centers fewer than a year
              before (and still one at least)
    alliance  springs 1901-1908, every power at once (played in self-play)

In the first four the policy plays the scenario's power against `opponent_bot` bots in the other
six; `alliance` seats the policy in all seven. Each game lasts the dimension's `HORIZONS`
years (`horizon` overrides them all). Per dimension and country (and `all`):
`normalized_reward`, `power_metrics` (`centers`, `center_gain`, `win_rate`, `gain_share`,
`survival_rate`, ...), `center_gain_se` (standard error over scenarios), `no_loss_rate` (plays
that lost no center) and `games`; `alliance` adds the `alliances.conduct` counts per play
(`alliances_formed`, `alliances_kept`, `supports_given`, `supports_received`, `promises`,
`promises_kept`) and, where promises were made, `promise_kept_rate`. The game's
`policy_metrics` runs it when `strategic.scenarios` > 0, so evaluation logs
`eval/strategic/<dimension>/<COUNTRY>/<metric>`.
"""

from __future__ import annotations

import json
import random
from functools import cache
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from sparring.games import GameSpec
from sparring.games.base import LEARNER, Play, PlayGames
from sparring.games.diplomacy.board import ROLES
from sparring.games.diplomacy.metrics import power_metrics
from sparring.games.diplomacy.scenarios import play_springs, position
from sparring.stats import mean_se

Dimension = Literal["opening", "midgame", "endgame", "crisis", "alliance"]
DIMENSIONS: tuple[Dimension, ...] = ("opening", "midgame", "endgame", "crisis", "alliance")
YEARS = {
    "opening": (1901, 1903),
    "midgame": (1904, 1908),
    "endgame": (1909, 1912),
    "crisis": (1902, 1912),
    "alliance": (1901, 1908),
}
"""Dimension -> (first, last) spring its scenarios start in."""
HORIZONS = {"opening": 1, "midgame": 1, "endgame": 1, "crisis": 2, "alliance": 2}
"""Game years per scenario: two where the result is what follows (a recovery, an alliance
kept)."""
SELFPLAY = ("alliance",)
"""Dimensions played with the policy in all seven seats."""
TRAJECTORY_BOTS = ("greedy", "random-legal", "support")
CONDUCT = (
    "alliances_formed",
    "alliances_kept",
    "supports_given",
    "supports_received",
    "promises",
    "promises_kept",
)
PRIMARY = {d: "center_gain" for d in DIMENSIONS} | {"alliance": "alliances_kept"}
"""The metric a dimension's table and heatmap show."""
PREFIX = "strategic"


class StrategicConfig(BaseModel):
    """The strategic evaluator's settings (the Diplomacy game parameter `strategic`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    scenarios: int = Field(0, ge=0)
    """Scenarios per dimension and country (`alliance`: states, each played by all seven);
    0 = the evaluator is off."""
    dimensions: tuple[Dimension, ...] = DIMENSIONS
    """Which dimensions to play."""
    opponent_bot: str = "greedy"
    """The bot in the six other seats (a name in `bots.BOTS`)."""
    trajectory_seed: int = 0
    """Seed of the trajectories the scenarios come from."""
    horizon: int | None = Field(None, ge=1)
    """Game years per scenario for every dimension; None = each dimension's `HORIZONS`."""
    max_new_tokens: int = Field(128, ge=1)
    """Tokens per turn of a model (set it as the evaluation's)."""
    max_trajectories: int = Field(400, ge=1)
    """Trajectories played at most while filling the sets (a set may then stay short)."""


# ---- scenario sets -----------------------------------------------------------------------------
def strong(centers: dict[str, int], power: str) -> bool:
    """At least 5 centers and at least the third-largest holding on the board."""
    third = sorted(centers.values(), reverse=True)[2]
    return centers[power] >= max(5, third)


def qualifies(
    dim: str, year: int, centers: dict[str, int], before: dict[str, int] | None, power: str | None
) -> bool:
    """Whether `power` (None: the whole board) at this spring fits `dim`, from the centers
    now and a year before (None at the first spring)."""
    first, last = YEARS[dim]
    if not first <= year <= last:
        return False
    if power is None:
        return True
    if dim in ("midgame", "endgame"):
        return strong(centers, power)
    if dim == "crisis":
        return before is not None and before[power] - centers[power] >= 2 and centers[power] > 0
    return centers[power] > 0


@cache
def scenario_sets(cfg: StrategicConfig) -> dict[str, list[dict[str, Any]]]:
    """{dimension: scenarios}, each a `generate_state`-style state plus `dimension`,
    `power` (None in self-play dimensions) and `trajectory`; no position twice for one
    dimension and power (the 1901 start is one). The same config always gives the same sets;
    cached per config."""
    need = {(d, p): cfg.scenarios for d in cfg.dimensions for p in _focus(d)}
    sets: dict[str, list[dict[str, Any]]] = {d: [] for d in cfg.dimensions}
    taken: set[tuple[str, str | None, str]] = set()  # (dimension, power, position)
    for t in range(cfg.max_trajectories):
        if not any(need.values()):
            break
        rng = random.Random(f"strategic:{cfg.trajectory_seed}:{t}")
        bots = {p: rng.choice(TRAJECTORY_BOTS) for p in ROLES}
        last = max(YEARS[d][1] for (d, _), n in need.items() if n)
        found: dict[tuple[str, str | None], list[tuple[str, dict]]] = {}
        before = None
        for engine in play_springs(bots, rng, last):
            year = int(engine.get_current_phase()[1:5])
            counts = {p: len(engine.get_centers(p)) for p in ROLES}
            wanted = [
                k for k, n in need.items() if n and qualifies(k[0], year, counts, before, k[1])
            ]
            if wanted:
                state = position(engine, bots)
                key = json.dumps([state["engine"]["units"], state["centers"]], sort_keys=True)
                for k in wanted:
                    if (*k, key) not in taken:
                        found.setdefault(k, []).append((key, state))
            before = counts
        for (d, p), options in found.items():
            key, state = rng.choice(options)
            taken.add((d, p, key))
            sets[d].append({**state, "seed": t, "dimension": d, "power": p, "trajectory": t})
            need[d, p] -= 1
    return sets


def _focus(dim: str) -> tuple[str | None, ...]:
    """The powers a dimension draws scenarios for: each, or None (all seven at once)."""
    return (None,) if dim in SELFPLAY else ROLES


# ---- playing and scoring -----------------------------------------------------------------------
def evaluate_strategic(
    policy: Any,
    sets: dict[str, list[dict[str, Any]]],
    play: PlayGames,
    game: GameSpec,
    sampling: Any,
    opponent: str,
    horizon: int | None = None,
) -> dict[str, float]:
    """Play every scenario of `sets` with `policy` (a generation backend or a scripted agent)
    in its power's seat (all seats in self-play dimensions), `opponent` bots elsewhere, one
    batched `play` (`sparring.rollout.play_games`) per horizon under `game`'s rules at
    `sampling`; return `strategic/<dimension>/<COUNTRY or all>/<metric>`."""

    games = [(d, s) for d, states in sets.items() for s in states]
    policies = {LEARNER: policy, opponent: GameSpec(name="diplomacy").make_agent(opponent)}
    plays: dict[str, list[Play]] = {d: [] for d in sets}
    for years in sorted({horizon or HORIZONS[d] for d, _ in games}):
        batch = [(d, s) for d, s in games if (horizon or HORIZONS[d]) == years]
        if not batch:
            continue
        rules = game.model_copy(update={"params": {**game.params, "horizon": years}})
        runs = [(f"{d}/{i}/{s['power'] or 'all'}", s) for i, (d, s) in enumerate(batch)]
        seats = [
            [LEARNER if s["power"] in (None, p) else opponent for p in ROLES] for _, s in batch
        ]
        played = play(rules, sampling, runs, policies, seats)
        for (d, s), ep in zip(batch, played, strict=True):
            mine = range(len(ROLES)) if s["power"] is None else [ROLES.index(s["power"])]
            plays[d] += [(vars(ep), seat) for seat in mine]
    metrics = {}
    for d, dim_plays in plays.items():
        groups = {"all": dim_plays} | {
            p: [(e, s) for e, s in dim_plays if e["roles"][s] == p] for p in ROLES
        }
        for name, group in groups.items():
            if group:
                metrics |= {
                    f"{PREFIX}/{d}/{name}/{k}": v
                    for k, v in strategic_metrics(group, d in SELFPLAY).items()
                }
    return metrics


def strategic_metrics(plays: list[Play], conduct: bool) -> dict[str, float]:
    """One cell's metrics (see the module docstring); `conduct` adds the alliance counts."""
    gains = [
        e["outcome"]["centers"][e["roles"][s]] - e["outcome"]["start_centers"][e["roles"][s]]
        for e, s in plays
    ]
    out = {
        "normalized_reward": float(np.mean([e["rewards"][s] for e, s in plays])),
        **power_metrics(plays),
        "center_gain_se": _se(gains),
        "no_loss_rate": float(np.mean([g >= 0 for g in gains])),
        "games": float(len(plays)),
    }
    if conduct:
        rows = [e["outcome"]["conduct"][e["roles"][s]] for e, s in plays]
        out |= {k: float(np.mean([r[k] for r in rows])) for k in CONDUCT}
        out["alliances_kept_se"] = _se([r["alliances_kept"] for r in rows])
        made = sum(r["promises"] for r in rows)
        if made:
            out["promise_kept_rate"] = sum(r["promises_kept"] for r in rows) / made
    return out


def _se(values: list[float]) -> float:
    """Standard error over scenarios (0 for one)."""
    return mean_se(values)[1] if len(values) > 1 else 0.0
