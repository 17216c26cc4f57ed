"""Game registry: `make_game("matching", k=4)` returns a fresh `Game`."""

from __future__ import annotations

import importlib
from typing import Any

from sparring.games.base import Game, GameStats, StepResult, TurnRecord

# name -> "module:Class"; imported lazily so optional games (diplomacy) cost nothing unused.
GAMES: dict[str, str] = {
    "matching": "sparring.games.matching:MatchingGame",
    "diplomacy": "sparring.games.diplomacy:DiplomacyGame",
}


def game_class(name: str) -> type[Game]:
    """Look up a game class by its registry name."""
    if name not in GAMES:
        raise ValueError(f"unknown game {name!r}; choose one of {sorted(GAMES)}")
    module, cls = GAMES[name].split(":")
    return getattr(importlib.import_module(module), cls)


def make_game(name: str, **params: Any) -> Game:
    """Build a game by name with its parameters (e.g. `k`, `max_turns`)."""
    return game_class(name)(**params)


__all__ = ["GAMES", "Game", "GameStats", "StepResult", "TurnRecord", "game_class", "make_game"]
