"""Rolling per-role metrics across iterations: the learner's last `RECENT_PLAYS` plays of each
role, carried from one rollout to the next with the rollout's outputs (seed 001's per-country
summary; restart-safe like the opponent schedule of `sparring.loop.league`).

    rows = recent_state(cfg, run_name, iteration, previous)     # what rollout i-1 stored
    metrics = save_recent(rows, episodes, iteration, out_dir)    # -> recent.jsonl in out_dir

For a game with a `role_breakdown` (Diplomacy: `country`), each rollout logs
`rollout/recent/<role_breakdown>/<role>/<metric>` over that role's last `RECENT_PLAYS` learner
plays, this rollout's included: `normalized_reward`, `games` (how many plays the window holds,
up to `RECENT_PLAYS`) and the game's own `episode_metrics`. A row of `recent.jsonl` is one play,
`{iteration, role, seat, episode}`, where `episode` is the games.jsonl episode without its
`transcript` and `messages` (a game's `episode_metrics` reads its outcome, roles and rewards).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from sparring import storage
from sparring.games import game_class
from sparring.games.base import LEARNER
from sparring.loop.config import PipelineConfig
from sparring.loop.io import run_uri
from sparring.metrics import ROLLOUT, metric_name, prefixed

RECENT_PLAYS = 100
"""Plays per role in the window."""
RECENT = "recent"
RECENT_FILE = "recent.jsonl"
BULKY = ("transcript", "messages")
"""Episode fields the window leaves out: every turn's text, every seat's chat."""


def recent_state(
    cfg: PipelineConfig, run_name: str, iteration: int, previous: str | Path | None = None
) -> list[dict[str, Any]]:
    """The window rollout `iteration` continues: the file `previous` if given, else the
    `recent.jsonl` that rollout `iteration - 1` of this run stored (so a campaign block's first
    rollout and a retried one continue it); empty for the first rollout."""
    if previous is not None:
        text = Path(previous).read_text() if Path(previous).exists() else None
    elif iteration > 0:
        uri = run_uri(cfg, run_name, iteration - 1, "rollout")
        text = storage.read_text(uri, RECENT_FILE, cfg.storage.client_config())
    else:
        text = None
    return [json.loads(line) for line in (text or "").splitlines() if line.strip()]


def update_recent(
    rows: list[dict[str, Any]],
    episodes: list[Any],
    iteration: int,
    size: int = RECENT_PLAYS,
    learner: str = LEARNER,
) -> list[dict[str, Any]]:
    """`rows` with every play of `learner` in `episodes` (Episode objects or their dicts)
    appended, then cut to each role's last `size` plays (oldest first)."""
    new = []
    for ep in episodes:
        e = ep if isinstance(ep, dict) else asdict(ep)
        slim = {k: v for k, v in e.items() if k not in BULKY}
        for seat, policy in enumerate(e["seat_policies"]):
            if policy == learner:
                row = {"iteration": iteration, "role": e["roles"][seat], "seat": seat}
                new.append(row | {"episode": slim})
    every = [r for r in rows if r["iteration"] < iteration] + new  # a retry replaces its own
    kept: dict[str, list[dict[str, Any]]] = {}
    for row in reversed(every):  # newest first
        plays = kept.setdefault(row["role"], [])
        if len(plays) < size:
            plays.append(row)
    keep = {id(r) for plays in kept.values() for r in plays}
    return [r for r in every if id(r) in keep]


def recent_metrics(rows: list[dict[str, Any]]) -> dict[str, float]:
    """`rollout/recent/<role_breakdown>/<role>/<metric>` over the window (see the module
    docstring); {} for a game without a `role_breakdown`, or an empty window."""
    if not rows:
        return {}
    game = game_class(rows[0]["episode"]["game_name"])
    if not game.role_breakdown:
        return {}
    by_role: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_role.setdefault(row["role"], []).append(row)
    out: dict[str, float] = {}
    for role, plays in by_role.items():
        pairs = [(r["episode"], r["seat"]) for r in plays]
        mean = sum(e["rewards"][s] for e, s in pairs) / len(pairs)
        own = {"normalized_reward": mean, "games": float(len(pairs))}
        own |= game.episode_metrics(pairs)
        out |= prefixed(metric_name(ROLLOUT, RECENT, game.role_breakdown, role), own)
    return out


def save_recent(
    rows: list[dict[str, Any]],
    episodes: list[Any],
    iteration: int,
    out_dir: str | Path,
    size: int = RECENT_PLAYS,
) -> dict[str, float]:
    """Add this rollout's learner plays to the window, write it as `recent.jsonl` into
    `out_dir` (uploaded with the rollout) and return its metrics."""
    window = update_recent(rows, episodes, iteration, size)
    with open(Path(out_dir) / RECENT_FILE, "w") as f:
        for row in window:
            f.write(json.dumps(row) + "\n")
    return recent_metrics(window)
