"""The game registry: every game is named once, here. `make_game("matching", k=4)` returns a
fresh `Game`; `GameSpec` is the `game:` block of every config.

A game is a package under `sparring/games/` whose `Game` subclass declares all that generic
code needs (see `sparring.games.base`); adding one means adding its package and one line to
`GAMES` (docs/adding-a-game.md).
"""

from __future__ import annotations

import importlib
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from sparring.games.base import Agent, Game, GameStats, StepResult, TurnRecord

# name -> "module:Class"; imported lazily so optional games cost nothing unused.
GAMES: dict[str, str] = {
    "matching": "sparring.games.matching:MatchingGame",
    "diplomacy": "sparring.games.diplomacy:DiplomacyGame",
    "kuhn-poker": "sparring.games.textarena:KuhnPoker",
    "tic-tac-toe": "sparring.games.textarena:TicTacToe",
    "simple-negotiation": "sparring.games.textarena:SimpleNegotiation",
}
DEFAULT_GAME = "matching"


def game_class(name: str) -> type[Game]:
    """Look up a game class by its registry name."""
    if name not in GAMES:
        raise ValueError(f"unknown game {name!r}; choose one of {sorted(GAMES)}")
    module, cls = GAMES[name].split(":")
    return getattr(importlib.import_module(module), cls)


def make_game(name: str, **params: Any) -> Game:
    """Build a game by name with its parameters (e.g. `k`, `max_turns`)."""
    return game_class(name)(**params)


class GameSpec(BaseModel):
    """Which game, with which rule parameters: the one `game:` block every config shares.

    YAML: `game: {name: matching, params: {k: 3}}`, or just `game: matching`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = DEFAULT_GAME
    """Registered game name (`GAMES`)."""
    params: dict[str, Any] = Field(default_factory=dict)
    """Rule parameters, e.g. {k: 4, max_turns: 30}; game-init, rollout and eval must agree."""

    @model_validator(mode="before")
    @classmethod
    def _from_name(cls, value: Any) -> Any:
        return {"name": value} if isinstance(value, str) else value

    @field_validator("name")
    @classmethod
    def _registered(cls, name: str) -> str:
        if name not in GAMES:
            raise ValueError(f"unknown game {name!r}; choose one of {sorted(GAMES)}")
        return name

    @property
    def cls(self) -> type[Game]:
        return game_class(self.name)

    def make(self) -> Game:
        """A fresh game with these rules."""
        return make_game(self.name, **self.params)

    def make_agent(self, agent: str, **params: Any) -> Agent:
        """One of this game's scripted agents."""
        return self.cls.make_agent(agent, **params)


__all__ = [
    "GameSpec",
    "DEFAULT_GAME",
    "GAMES",
    "Agent",
    "Game",
    "GameStats",
    "StepResult",
    "TurnRecord",
    "game_class",
    "make_game",
]
