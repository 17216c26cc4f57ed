"""The matching game: dialop's reviewer-paper "optimization" game, for two cooperating seats.

Rules (from dialop's code, see docs/games.md):
- A hidden k x k table of reviewer-paper affinities, values randint(0, 100) = 0..99.
- Each seat sees each cell independently with probability `p_visible` (0.4). A cell hidden
  from both seats is set to 50. Each seat's visible numbers are multiplied by a private scale
  ~U(1, 10) and truncated to int, so raw numbers can't be compared across seats.
- "Hard" tables only: resample while either seat's best assignment from its own knowledge
  (unknown cells = 50) already reaches best / `hard_ratio`.
- Seats alternate turns. The action is the last line that opens with a tag (reasoning may come
  before it; a tag inside prose is not an action): `[message] text`, `[propose]` + exactly k
  `reviewer: paper` lines, `[accept]`, `[reject]`. After a proposal the partner must accept
  or reject. Accept ends the game; reject clears the proposal and the rejecting seat keeps the
  turn (as in dialop).
- Reward, shared by both seats: true value of the accepted assignment / best assignment value
  (Hungarian, via scipy). No deal within `max_turns` turns gives 0. Optional shaping:
  `invalid_penalty` (default 0, as in dialop) is subtracted per invalid action of that seat.
- A bad action (or a turn over `max_chars` characters) is shown to the actor only, who retries;
  after `max_retries` retries the turn is forfeited (a forfeited turn with a pending proposal
  counts as a reject). With `count_tries` every try counts toward `max_turns`, as in dialop.
- `preset: dialop` plays dialop's setting (`PRESETS`); other parameters given with it override it.
"""

from __future__ import annotations

import itertools
import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from sparring.games.base import Baseline, Game, GameStats, Play, StepResult, TurnRecord
from sparring.games.matching.baselines import (
    identity_deal,
    no_communication_ceiling,
    own_view_deal,
    random_deal,
)
from sparring.games.matching.parse import parse_action
from sparring.games.matching.prompt import share_message, system_prompt
from sparring.games.matching.table import generate_state
from sparring.metrics import SELFPLAY

PRESETS: dict[str, dict[str, Any]] = {
    "dialop": {
        "k": 8,
        "names": "dialop",
        "random_names": False,
        "p_visible": 0.4,
        "hard_ratio": 1.25,
        "max_turns": 30,
        "count_tries": True,
        "max_retries": 30,
        "mention_scale": False,
    }
}
"""Named parameter sets. `dialop`: k=8, dialop's fixed names, a 30-turn cap that counts every
try (dialop's evaluation loop; a bad try never forfeits before the cap), and the information
dialop's LLM prompt gives (its own scaled table; the private scale is not mentioned)."""


LEGAL_MAX_K = 4
"""The largest table whose moves `legal_moves` lists (k! = 24 proposals)."""


class MatchingConfig(BaseModel):
    """Rule parameters of the matching game (the `game.params` of a run)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    preset: Literal["dialop"] | None = None
    """A named parameter set (`PRESETS`); parameters given with it override it."""
    k: int = Field(8, ge=2)
    """Reviewers = papers."""
    p_visible: float = Field(0.4, gt=0.0, le=1.0)
    """Chance that a seat sees a cell."""
    hard_ratio: float | None = 1.25
    """Keep tables where neither seat alone reaches best / hard_ratio (None: any table)."""
    max_turns: int = Field(30, ge=2)
    """Turn cap: no deal by then gives 0."""
    max_retries: int = Field(2, ge=0)
    """Retries after a bad action before the turn is forfeited."""
    count_tries: bool = False
    """Every try, bad ones included, counts toward `max_turns` (dialop's loop)."""
    names: Literal["pool", "dialop"] = "pool"
    """Name set: 16 short names each ("pool") or dialop's 8 fixed reviewers and papers."""
    random_names: bool = True
    """Draw k names from the set per game; False = its first k, in order."""
    mention_scale: bool = True
    """Tell the players that each one's scores carry a private scale factor."""
    max_chars: int | None = Field(2000, ge=1)
    """A longer turn is refused (an invalid action) before parsing."""
    invalid_penalty: float = Field(0.0, ge=0.0)
    """Subtracted from a seat's reward per invalid action (shaping; 0 in dialop)."""

    @model_validator(mode="before")
    @classmethod
    def _preset(cls, params: Any) -> Any:
        if isinstance(params, dict) and params.get("preset") is not None:
            name = params["preset"]
            if name not in PRESETS:
                raise ValueError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
            return {**PRESETS[name], **params}
        return params


class MatchingGame(Game):
    """Two seats negotiate a reviewer-paper assignment. See the module docstring for rules."""

    name = "matching"
    roles = ("player_a", "player_b")
    agents = {
        "matching-scripted": "sparring.games.matching.agents:ScriptedMatchingAgent",
        "matching-scratchpad": "sparring.games.matching.agents:ScratchpadMatchingAgent",
    }
    default_opponent = "matching-scripted"

    def __init__(self, **params: Any) -> None:
        self.cfg = cfg = MatchingConfig(**params)
        self.k, self.max_turns, self.max_retries = cfg.k, cfg.max_turns, cfg.max_retries
        self.invalid_penalty = cfg.invalid_penalty
        self.state: dict[str, Any] | None = None

    @classmethod
    def turn_budget(cls, params: dict[str, Any]) -> int:
        """`max_turns`."""
        return MatchingConfig(**params).max_turns

    @classmethod
    def episode_metrics(cls, plays: list[Play]) -> dict[str, float]:
        """`agreement_rate`, the share of plays whose game ended in an accepted proposal, and
        `reward_given_agreement`, the mean reward of those plays (the deal's quality apart from
        reaching one; 0 when none agreed)."""
        agreed = [e["rewards"][seat] for e, seat in plays if e["outcome"]["agreed"]]
        return {
            "agreement_rate": len(agreed) / len(plays),
            "reward_given_agreement": sum(agreed) / len(agreed) if agreed else 0.0,
        }

    @classmethod
    def baselines(cls) -> tuple[Baseline, ...]:
        """In self-play: the exact deal baselines of `sparring.games.matching.baselines` (the
        random, identity and own-view deals trivial; the no-communication ceiling a reference)
        and the scripted full-information agent in both seats, played."""
        return (
            Baseline("random-deal", SELFPLAY, trivial=True, value=random_deal),
            Baseline("identity-deal", SELFPLAY, trivial=True, value=identity_deal),
            Baseline("own-view-deal", SELFPLAY, trivial=True, value=own_view_deal),
            Baseline("no-communication", SELFPLAY, trivial=False, value=no_communication_ceiling),
            Baseline("matching-scripted", SELFPLAY, trivial=False, agent="matching-scripted"),
        )

    @classmethod
    def choose_legal_refused(cls, params: dict[str, Any]) -> str | None:
        """Beyond k=4 the k! proposals are too many to score every turn."""
        k = MatchingConfig(**params).k
        if k > LEGAL_MAX_K:
            return (f"matching lists its legal moves up to k={LEGAL_MAX_K} (k! proposals each "
                    f"turn: {math.factorial(k)} at k={k}); write free text (choose_legal: false)")  # fmt: skip
        return None

    def legal_moves(self, seat: int) -> list[str]:
        """The replies `rollout.choose_legal` draws from: with a proposal pending, `[accept]`
        and `[reject]`; else a message sharing every cell the seat sees (`share_message`, the
        scripted agent's full share) and each of the k! proposals. What to say is fixed; when
        to share, which plan to propose and what to accept are the policy's."""
        if self._proposal is not None:
            return ["[accept]", "[reject]"]
        plans = itertools.permutations(range(self.k))
        return [share_message(self.state, seat)] + [self.render_proposal(list(c)) for c in plans]

    def generate_state(self, seed: int) -> dict[str, Any]:
        c = self.cfg
        return generate_state(
            seed, c.k, c.p_visible, c.hard_ratio, random_names=c.random_names, names=c.names
        )

    # ---- lifecycle -------------------------------------------------------------------------
    def reset(self, state: dict[str, Any]) -> None:
        self.state = state
        self.k = state["k"]
        self._turn = 0  # legal actions + forfeits
        self._seat = 0
        self._retries = 0
        self._proposal: list[int] | None = None  # reviewer i -> paper index
        self._accepted: list[int] | None = None
        self._done = False
        self._transcript: list[TurnRecord] = []
        self._stats = GameStats([0, 0], [0, 0], [0, 0])
        self._chat = [[{"role": "system", "content": self._system_prompt(s)}] for s in range(2)]
        self._tell(0, "You move first. " + self._cue())

    @property
    def pending_seats(self) -> list[int]:
        return [] if self._done else [self._seat]

    @property
    def done(self) -> bool:
        return self._done

    @property
    def rewards(self) -> list[float]:
        r = (
            self.proposal_value(self._accepted) / self.state["best_value"]
            if self._accepted
            else 0.0
        )
        return [r - self.invalid_penalty * n for n in self._stats.invalid_actions]

    def outcome(self) -> dict[str, Any]:
        return {
            "agreed": self._accepted is not None,
            "accepted_assignment": self._named(self._accepted) if self._accepted else None,
            "accepted_value": self.proposal_value(self._accepted) if self._accepted else None,
            "best_value": self.state["best_value"],
        }

    # ---- the move --------------------------------------------------------------------------
    def _act(self, seat: int, text: str) -> StepResult:
        action, error = self.parse(text)
        if error is None:
            error = self._check_legal(action)
        if error is not None:
            return self._reject_action(seat, text, action, error)
        self._apply(seat, action)
        self._transcript.append(TurnRecord(self._turn, seat, text, True, action=action))
        self._end_turn(keep_seat=action["type"] == "reject")
        return StepResult(ok=True, action=action)

    def _reject_action(self, seat: int, text: str, action: dict | None, error: str) -> StepResult:
        self._stats.invalid_actions[seat] += 1
        self._retries += 1
        forfeited = self._retries > self.max_retries
        self._transcript.append(TurnRecord(self._turn, seat, text, False, error, action, forfeited))
        if self.cfg.count_tries and not forfeited:  # the try uses up a turn of the cap
            self._turn += 1
            self._done = self._turn >= self.max_turns
        if not forfeited:
            left = self.max_retries - self._retries + 1
            self._tell(seat, f"Error: {error}. Try again ({left} tries left).")
            return StepResult(ok=False, error=error, action=action)
        self._stats.forfeits[seat] += 1
        self._tell(seat, f"Error: {error}. You lost your turn.")
        if self._proposal is not None:  # a forfeited reply to a proposal counts as a reject
            self._proposal = None
            self._tell(1 - seat, "Partner did not answer; your proposal was rejected.")
        else:
            self._tell(1 - seat, "Partner lost their turn.")
        self._end_turn()
        return StepResult(ok=False, error=error, action=action, forfeited=True)

    def _end_turn(self, keep_seat: bool = False) -> None:
        self._turn += 1
        self._retries = 0
        if not keep_seat:
            self._seat = 1 - self._seat
        if self._accepted is not None or self._turn >= self.max_turns:
            self._done = True
        else:
            self._tell(self._seat, self._cue())

    def _cue(self) -> str:
        """The last line of a seat's observation when its turn starts: what it may write now."""
        if self._proposal is not None:
            return "Reply with [accept] or [reject]."
        return "Your turn: write one line that starts with [message] or [propose]."

    def _check_legal(self, action: dict[str, Any]) -> str | None:
        pending = self._proposal is not None
        if pending and action["type"] not in ("accept", "reject"):
            return "your partner made a proposal; reply with [accept] or [reject]"
        if not pending and action["type"] in ("accept", "reject"):
            return f"there is no proposal to {action['type']}"
        return None

    def _apply(self, seat: int, action: dict[str, Any]) -> None:
        kind, other = action["type"], 1 - seat
        if kind == "message":
            self._tell(other, f"Partner: [message] {action['text']}")
        elif kind == "propose":
            self._proposal = [
                self.state["papers"].index(action["assignment"][r]) for r in self.state["reviewers"]
            ]
            self._tell(other, "Partner: " + self.render_proposal(self._proposal))
        elif kind == "accept":
            self._accepted, self._proposal = self._proposal, None
        else:  # reject: the rejecting seat keeps the turn
            self._proposal = None
            self._tell(other, "Partner: [reject]")
            self._tell(seat, "You rejected the proposal. It is still your turn.")

    def parse(self, text: str) -> tuple[dict[str, Any] | None, str | None]:
        """Parse raw model text into an action. Returns (action, None) or (partial, error)."""
        st = self.state
        return parse_action(text, st["reviewers"], st["papers"], self.cfg.max_chars)

    # ---- helpers ---------------------------------------------------------------------------
    def proposal_value(self, cols: list[int]) -> float:
        table = self.state["table"]
        return float(sum(table[r][c] for r, c in enumerate(cols)))

    def _named(self, cols: list[int]) -> dict[str, str]:
        return {self.state["reviewers"][r]: self.state["papers"][c] for r, c in enumerate(cols)}

    def render_proposal(self, cols: list[int]) -> str:
        return "[propose]\n" + "\n".join(f"{r}: {p}" for r, p in self._named(cols).items())

    def _system_prompt(self, seat: int) -> str:
        return system_prompt(self.state, seat, self.cfg.mention_scale)
