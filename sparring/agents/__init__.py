"""Scripted (non-model) agents: baselines, warm-start teachers and opponents.

An agent plays one seat: `agent.act(game, seat)` returns the raw text that seat sends to
`game.step`. Agents may read only what that seat may see: `game.messages(seat)` and the
seat's own private view in `game.state` (e.g. `state["views"][seat]` for matching).
Register new agents in `AGENTS` as "module:Class", an agent for game `g` in module
`sparring.agents.g` (`agents_for(g)` relies on it); `make_agent(name, **params)` builds them.
"""

from __future__ import annotations

import importlib
from typing import Any, Protocol

from sparring.games.base import Game


class Agent(Protocol):
    """A scripted policy for one seat."""

    def act(self, game: Game, seat: int) -> str:
        """The seat's next raw text."""
        ...


# name -> "module:Class"
AGENTS: dict[str, str] = {
    "matching-scripted": "sparring.agents.matching:ScriptedMatchingAgent",
    "hold": "sparring.agents.diplomacy:HoldBot",
    "random-legal": "sparring.agents.diplomacy:RandomLegalBot",
    "greedy": "sparring.agents.diplomacy:GreedyBot",
}


def make_agent(name: str, **params: Any) -> Agent:
    """Build a registered scripted agent by name."""
    if name not in AGENTS:
        raise ValueError(f"unknown agent {name!r}; choose one of {sorted(AGENTS)}")
    module, cls = AGENTS[name].split(":")
    return getattr(importlib.import_module(module), cls)(**params)


def agents_for(game: str) -> list[str]:
    """Names of the registered agents that play `game` (those in `sparring.agents.<game>`)."""
    return sorted(n for n, ref in AGENTS.items() if ref.split(":")[0] == f"{__name__}.{game}")
