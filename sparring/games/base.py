"""The game interface every Sparring game implements.

A game is a turn-based environment for N seats that talk in plain text:

    game = make_game("matching", k=4)
    game.reset(initial_state)           # a JSON-serialisable dict from game_init
    while not game.done:
        seat = game.current_seat       # whose move it is
        chat = game.messages(seat)     # that seat's view, as chat messages
        result = game.step(seat, text) # the seat's raw model text; never raises on bad text
    game.rewards                        # one float per seat

Rules for implementers:
- `step` must accept any string. A bad action returns `StepResult(ok=False, error=...)`; the
  error is appended to the actor's view only, and the same seat moves again until the game's
  retry bound, after which its turn is forfeited.
- `messages(seat)` starts with one system message and then alternates user/assistant, ending
  with a user message whenever `seat` is to move. Assistant messages are that seat's raw texts.
- `current_seat` may list several seats at once for simultaneous-move games (`pending_seats`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any


@dataclass
class StepResult:
    """What happened when a seat acted."""

    ok: bool
    """True if the action was legal and applied."""
    error: str | None = None
    """Why the action was rejected (shown only to the actor)."""
    forfeited: bool = False
    """True if this bad action used up the seat's last retry and its turn was skipped."""
    action: dict[str, Any] | None = None
    """The parsed action, e.g. {"type": "propose", "assignment": {...}}."""


@dataclass
class TurnRecord:
    """One entry of a game transcript (games.jsonl)."""

    turn: int
    seat: int
    text: str
    ok: bool
    error: str | None = None
    action: dict[str, Any] | None = None
    forfeited: bool = False


@dataclass
class GameStats:
    """Per-seat counters kept by every game."""

    invalid_actions: list[int] = field(default_factory=list)
    forfeits: list[int] = field(default_factory=list)
    words: list[int] = field(default_factory=list)


class Game(ABC):
    """Abstract multi-seat text game. See the module docstring for the contract."""

    name: str = "game"
    roles: tuple[str, ...] = ()

    @property
    def num_seats(self) -> int:
        return len(self.roles)

    @abstractmethod
    def reset(self, state: dict[str, Any]) -> None:
        """Start a fresh game from an initial state produced by `generate_state`."""

    @abstractmethod
    def step(self, seat: int, text: str) -> StepResult:
        """Apply `seat`'s raw text. Must not raise for any text."""

    @property
    @abstractmethod
    def pending_seats(self) -> list[int]:
        """Seats that must act now (empty when the game is done)."""

    @property
    def current_seat(self) -> int | None:
        """The single seat to move, for strictly alternating games."""
        pending = self.pending_seats
        return pending[0] if pending else None

    @property
    @abstractmethod
    def done(self) -> bool: ...

    @property
    @abstractmethod
    def rewards(self) -> list[float]:
        """Normalized reward per seat (final once `done`)."""

    # Filled in by each game's `reset`: every seat's chat, the turn records and the counters.
    _chat: list[list[dict[str, str]]]
    _transcript: list[TurnRecord]
    _stats: GameStats

    def messages(self, seat: int) -> list[dict[str, str]]:
        """The chat history from `seat`'s point of view (system first), as a copy."""
        return [dict(m) for m in self._chat[seat]]

    @property
    def transcript(self) -> list[TurnRecord]:
        return self._transcript

    @property
    def stats(self) -> GameStats:
        return self._stats

    @property
    def num_turns(self) -> int:
        """Turns taken so far (legal actions plus forfeits)."""
        return sum(1 for t in self.transcript if t.ok or t.forfeited)

    def outcome(self) -> dict[str, Any]:
        """Game-specific summary for games.jsonl (e.g. whether a deal was reached)."""
        return {}
