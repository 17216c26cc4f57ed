"""The game interface every Sparring game implements.

A game is a turn-based environment for N seats that talk in plain text:

    game = make_game("matching", k=4)
    game.reset(initial_state)           # a JSON-serialisable dict from game_init
    while not game.done:
        seat = game.current_seat       # whose move it is
        chat = game.messages(seat)     # that seat's view, as chat messages
        result = game.step(seat, text) # the seat's raw model text; never raises on bad text
    game.rewards                        # one float per seat

Rules for implementers (docs/adding-a-game.md walks through one):
- `generate_state(seed)` returns a JSON-serialisable initial state; the same seed always gives
  the same state.
- `step` is a template: it checks the game is running and `seat` is pending, records the text
  in the seat's chat, then calls `_act(seat, text)`, which must accept any string.
- The `ok` contract is the same in every game: `ok=True` means the action was applied;
  `ok=False` means it was rejected (with `error`, shown to the actor only), and the same seat
  moves again until the game's retry bound, after which its turn is forfeited
  (`forfeited=True`).
- `messages(seat)` starts with one system message and then alternates user/assistant, ending
  with a user message whenever `seat` is to move. Assistant messages are that seat's raw texts.
- `current_seat` may list several seats at once for simultaneous-move games (`pending_seats`).
- Generic code learns everything game-specific through the class attributes and hooks below:
  `agents` (scripted agents by name), `learner_agents`, `default_opponent`,
  `extra_group_keys`, `image_flavour`, `group_keys(seat)`, `transfer_pairs`,
  `turn_budget(params)`, `episode_metrics(plays)`, `role_breakdown`, `eval_lineups(mode,
  opponent)`, `baselines()`, `policy_metrics`, `reads_policy_table` with `average_rows`, and
  `write_report`. It never reads a key of `outcome()` or of the rule parameters
  (tests/games/test_seam.py).
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol

from sparring.metrics import SELFPLAY, VS_PREVIOUS

PlayGames = Callable[..., list[Any]]
"""`sparring.rollout.play_games(game, sampling, runs, policies, seat_plan)`: one batched
rollout of `runs` ((id, state) pairs) under the `GameSpec` `game` at `sampling`, each seated
per `seat_plan`; its episodes. Handed to `Game.policy_metrics` by the evaluation."""

LEARNER = "policy"
"""The seat name of the policy being trained: rollouts, evaluation and the trainer's row filter
all call it this; scripted opponents and earlier checkpoints have their own names."""
PREVIOUS = "previous"
"""The seat name of the checkpoint the learner is compared with in evaluation's `vs_previous`."""

Play = tuple[dict[str, Any], int]
"""One seat of one finished game: the episode (a games.jsonl dict) and the seat index."""


@dataclass(frozen=True)
class Lineup:
    """One seating that evaluation plays on every val state."""

    mode: str
    """The eval mode its games count for: metrics `eval/<mode>/<role>/*`."""
    seats: tuple[str, ...]
    """A policy per seat: `LEARNER`, `PREVIOUS` or one of the game's scripted agents."""


@dataclass(frozen=True)
class Baseline:
    """A policy evaluation reports next to the model, on the same val states: played (a
    scripted `agent` takes the learner's seats in `mode`'s lineups) or exact (`value`)."""

    name: str
    """Its metrics: `eval/baseline/<name>` and `eval/baseline/<name>_se`."""
    mode: str
    """The eval mode it stands in for the model in: it is compared with
    `eval/<mode>/all/normalized_reward`, and reported only when that mode is evaluated."""
    trivial: bool
    """A policy without skill (random, fixed): `eval/gain_over_best_trivial` is the model's
    reward minus the best of these. False: a reference (an optimum, a scripted expert)."""
    agent: str | None = None
    """Played: one of the game's scripted agents, in every seat the learner holds in `mode`
    (the other seats as in the model's games), one game per lineup and state."""
    value: Callable[[dict[str, Any]], float] | None = None
    """Exact: its normalized reward on an initial state, from the state alone (a closed
    form, or an expectation over the policy's randomness); no game is played."""

    def __post_init__(self) -> None:
        if (self.agent is None) == (self.value is None):
            raise ValueError(f"baseline {self.name!r} needs exactly one of agent and value")


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


class Agent(Protocol):
    """A scripted policy for one seat: reads only what that seat may see."""

    def act(self, game: Game, seat: int) -> str:
        """The seat's next raw text."""
        ...


class Game(ABC):
    """Abstract multi-seat text game. See the module docstring for the contract."""

    name: str = "game"
    roles: tuple[str, ...] = ()
    agents: ClassVar[dict[str, str]] = {}
    """Scripted agents of this game: name -> "module:Class" (baselines, teachers, opponents)."""
    learner_agents: ClassVar[frozenset[str]] = frozenset()
    """The agents among `agents` that answer the learner as it is now (an exploiter): the
    rollout builds them with `learner` (its policy), `rules` (a game of these rules) and
    `temperature` (the learner's sampling temperature)."""
    default_opponent: str | None = None
    """The scripted agent `evaluate` plays against in `vs_scripted` mode."""
    extra_group_keys: ClassVar[tuple[str, ...]] = ()
    """GRPO group keys this game adds to the generic ones (the keys of `group_keys(seat)`)."""
    group_key_aliases: ClassVar[dict[str, str]] = {}
    """Deprecated group-key name -> its current name."""
    group_key_synonyms: ClassVar[dict[str, str]] = {}
    """This game's word for a generic group key -> the key (e.g. Diplomacy's init_country)."""
    default_group_key: ClassVar[str] = "init"
    """The GRPO group a recipe uses unless it sets `train.group_key`: `init` where the seats
    of a state share a reward, `init_seat` where they differ (zero-sum games, Diplomacy), so
    that each seat's baseline is its own."""
    image_flavour: ClassVar[str | None] = None
    """If set, the game's engine is only in the `-<flavour>` runtime images (a licence apart),
    where a pipeline config that names no image runs."""
    transfer_pairs: ClassVar[tuple[tuple[str, str], ...]] = ()
    """Pairs of strategically similar roles whose prompts' mean final hidden states the
    trainer's transfer loss pulls together when a recipe sets `train.transfer_weight` and no
    `train.transfer_pairs`; () = none (such a recipe must name its pairs)."""
    role_breakdown: ClassVar[str | None] = None
    """If set, rollout also logs the learner's metrics per role, as
    `rollout/<role_breakdown>/<role>/<metric>`."""
    reads_policy_table: ClassVar[bool] = False
    """Whether `policy_metrics` hold the model's whole policy (a table over every decision of
    the game), so that `average_rows` fits the mixture of the iterates exactly (Kuhn Poker)."""

    @abstractmethod
    def generate_state(self, seed: int) -> dict[str, Any]:
        """A seeded, JSON-serialisable initial state (the same seed gives the same state)."""

    def group_keys(self, seat: int) -> dict[str, str]:
        """This seat's values of `extra_group_keys` for the current state (samples columns)."""
        return {}

    @property
    def num_seats(self) -> int:
        return len(self.roles)

    @abstractmethod
    def reset(self, state: dict[str, Any]) -> None:
        """Start a fresh game from an initial state produced by `generate_state`."""

    def step(self, seat: int, text: str) -> StepResult:
        """Apply `seat`'s raw text. Never raises for any text (see the `ok` contract)."""
        if self.done:
            return StepResult(ok=False, error="the game is over")
        if seat not in self.pending_seats:
            return StepResult(ok=False, error=f"it is not {self.roles[seat]}'s turn")
        text = text if isinstance(text, str) else str(text)
        self._chat[seat].append({"role": "assistant", "content": text})
        self._stats.words[seat] += len(text.split())
        return self._act(seat, text)

    @abstractmethod
    def _act(self, seat: int, text: str) -> StepResult:
        """Parse and apply the text `step` just recorded in `seat`'s chat."""

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
        """Game-specific summary for games.jsonl (read only by this game's own hooks)."""
        return {}

    def _tell(self, seat: int, text: str) -> None:
        """Append to `seat`'s pending user message (merged so roles keep alternating)."""
        chat = self._chat[seat]
        if chat[-1]["role"] == "user":
            chat[-1]["content"] += "\n" + text
        else:
            chat.append({"role": "user", "content": text})

    # ---- hooks for generic code (rollout metrics, evaluation) --------------------------------
    @classmethod
    def make_agent(cls, name: str, **params: Any) -> Agent:
        """Build one of this game's scripted agents by name."""
        if name not in cls.agents:
            raise ValueError(
                f"unknown agent {name!r} for {cls.name}; choose one of {sorted(cls.agents)}"
            )
        if name in cls.learner_agents and "learner" not in params:
            raise ValueError(
                f"{name} answers the learner as it is now, so only a rollout that seats the "
                "learner can seat it (opponents.difficulty.pool); pick another agent here"
            )
        module, attr = cls.agents[name].split(":")
        return getattr(importlib.import_module(module), attr)(**params)

    @classmethod
    @abstractmethod
    def turn_budget(cls, params: dict[str, Any]) -> int:
        """The most turns (`num_turns`) one game with these rule parameters can take."""

    @classmethod
    def choose_legal_refused(cls, params: dict[str, Any]) -> str | None:
        """Why these rule parameters can't be played by choosing among `legal_moves` (say, too
        many moves to score each turn), or None. Only games with `legal_moves` are asked."""
        return None

    @classmethod
    def episode_metrics(cls, plays: list[Play]) -> dict[str, float]:
        """This game's own metrics of some plays, named without a prefix: rollout logs them
        over all the learner's plays (`rollout/<name>`), evaluation over one role's plays at a
        time (`eval/<mode>/<role>/<name>`)."""
        return {}

    @classmethod
    def eval_lineups(cls, mode: str, opponent: str | None) -> list[Lineup]:
        """The seatings evaluation `mode` plays: self-play is the learner in every seat; the
        other modes seat it in each seat in turn, against `PREVIOUS` or the scripted
        `opponent` in all the others."""
        n = len(cls.roles)
        if mode == SELFPLAY:
            return [Lineup(mode, (LEARNER,) * n)]
        other = PREVIOUS if mode == VS_PREVIOUS else opponent
        return [
            Lineup(mode, tuple(LEARNER if s == seat else other for s in range(n)))
            for seat in range(n)
        ]

    @classmethod
    def baselines(cls) -> tuple[Baseline, ...]:
        """The trivial and reference policies evaluation reports beside the model (none by
        default)."""
        return ()

    def policy_metrics(
        self, policy: Any, temperature: float, play: PlayGames | None = None
    ) -> dict[str, float]:
        """Metrics of the evaluated model beyond the evaluation's own games (Kuhn Poker: its
        exploitability; Diplomacy: the strategic evaluator), named without a prefix: evaluation
        logs them as `eval/<name>`. `policy` is the model's backend; `temperature` the
        evaluation's; `play` the engine's way to play extra games, handed in by the caller
        (games sit below the engine). None by default."""
        return {}

    def average_rows(
        self,
        tokenizer: Any,
        iterates: list[dict[str, float]],
        temperature: float,
        weights: list[float],
    ) -> list[dict[str, Any]]:
        """Weighted samples rows (`sparring.samples`) whose imitation at `temperature`
        (`sparring.sft`, token-mean) fits the mixture of the iterates (one drawn per game, in
        proportion to `weights`) whose `policy_metrics` are `iterates`. Only games that
        `reads_policy_table`."""
        raise NotImplementedError(f"{self.name} reads no policy table out (reads_policy_table)")

    @classmethod
    def write_report(cls, metrics: dict[str, float], out_dir: Path) -> dict[str, Path]:
        """Extra evaluation report files (tables, plots) written next to metrics.json."""
        return {}

    @classmethod
    def write_comparison(
        cls, by_model: dict[str, dict[str, float]], out_dir: Path
    ) -> dict[str, Path]:
        """Report files comparing several models' `policy_metrics` (`sparring compare`;
        {label: metrics named `eval/<name>`}); none by default."""
        return {}
