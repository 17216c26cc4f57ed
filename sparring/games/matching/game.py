"""The matching game: dialop's reviewer-paper "optimization" game, for two cooperating seats.

Rules (from dialop, see DESIGN.md):
- A hidden k x k table of reviewer-paper affinities, values randint(0, 100).
- Each seat sees each cell independently with probability `p_visible` (0.4). A cell hidden
  from both seats is set to 50. Each seat's visible numbers are multiplied by a private scale
  ~U(1, 10) and truncated to int, so raw numbers can't be compared across seats.
- "Hard" tables only: resample while either seat's best assignment from its own knowledge
  (unknown cells = 50) already reaches best / `hard_ratio`.
- Seats alternate turns. The last tag in a turn is the action:
  `[message] text`, `[propose]` + exactly k `reviewer: paper` lines, `[accept]`, `[reject]`.
  After a proposal the partner must accept or reject. Accept ends the game; reject clears it.
- Reward, shared by both seats: true value of the accepted assignment / best assignment value
  (Hungarian, via scipy). No deal within `max_turns` turns gives 0. Optional shaping:
  `invalid_penalty` (default 0, as in dialop) is subtracted per invalid action of that seat.
- A bad action is shown to the actor only, who retries; after `max_retries` retries the turn is
  forfeited (a forfeited turn with a pending proposal counts as a reject).
"""

from __future__ import annotations

from typing import Any

from sparring.games.base import Game, GameStats, StepResult, TurnRecord
from sparring.games.matching.parse import parse_action
from sparring.games.matching.table import generate_state


class MatchingGame(Game):
    """Two seats negotiate a reviewer-paper assignment. See the module docstring for rules."""

    name = "matching"
    roles = ("player_a", "player_b")
    agents = {"matching-scripted": "sparring.games.matching.agents:ScriptedMatchingAgent"}
    default_opponent = "matching-scripted"

    def __init__(
        self,
        k: int = 8,
        p_visible: float = 0.4,
        hard_ratio: float | None = 1.25,
        max_turns: int = 30,
        max_retries: int = 2,
        random_names: bool = True,
        invalid_penalty: float = 0.0,
    ) -> None:
        if max_turns < 2 or max_retries < 0:
            raise ValueError("max_turns must be >= 2 and max_retries >= 0")
        if invalid_penalty < 0:
            raise ValueError(f"invalid_penalty must be >= 0, got {invalid_penalty}")
        self.invalid_penalty = invalid_penalty
        self.k, self.p_visible, self.hard_ratio = k, p_visible, hard_ratio
        self.random_names = random_names
        self.max_turns, self.max_retries = max_turns, max_retries
        self.state: dict[str, Any] | None = None

    def generate_state(self, seed: int) -> dict[str, Any]:
        return generate_state(
            seed, self.k, self.p_visible, self.hard_ratio, random_names=self.random_names
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
        self._tell(0, "You move first.")

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
        self._end_turn()
        return StepResult(ok=True, action=action)

    def _reject_action(self, seat: int, text: str, action: dict | None, error: str) -> StepResult:
        self._stats.invalid_actions[seat] += 1
        self._retries += 1
        forfeited = self._retries > self.max_retries
        self._transcript.append(TurnRecord(self._turn, seat, text, False, error, action, forfeited))
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

    def _end_turn(self) -> None:
        self._turn += 1
        self._retries = 0
        self._seat = 1 - self._seat
        if self._accepted is not None or self._turn >= self.max_turns:
            self._done = True

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
        else:  # reject
            self._proposal = None
            self._tell(other, "Partner: [reject]")

    def parse(self, text: str) -> tuple[dict[str, Any] | None, str | None]:
        """Parse raw model text into an action. Returns (action, None) or (partial, error)."""
        return parse_action(text, self.state["reviewers"], self.state["papers"])

    # ---- helpers ---------------------------------------------------------------------------
    def proposal_value(self, cols: list[int]) -> float:
        table = self.state["table"]
        return float(sum(table[r][c] for r, c in enumerate(cols)))

    def _named(self, cols: list[int]) -> dict[str, str]:
        return {self.state["reviewers"][r]: self.state["papers"][c] for r, c in enumerate(cols)}

    def render_proposal(self, cols: list[int]) -> str:
        return "[propose]\n" + "\n".join(f"{r}: {p}" for r, p in self._named(cols).items())

    def _system_prompt(self, seat: int) -> str:
        st = self.state
        view = st["views"][seat]
        width = max(len(p) for p in st["papers"]) + 1
        head = " " * 6 + "".join(p.rjust(width) for p in st["papers"])
        rows = [
            r.ljust(6) + "".join(("?" if v is None else str(v)).rjust(width) for v in view[i])
            for i, r in enumerate(st["reviewers"])
        ]
        return (
            f"You and a partner assign {self.k} reviewers to {self.k} papers, one paper each, "
            "to maximize the total score. You each see different scores, scaled by a private "
            "factor; ? means you cannot see it. Share what you know and agree on a plan.\n"
            "Your scores:\n" + head + "\n" + "\n".join(rows) + "\n"
            "End each turn with one action: [message] text, [propose] then one "
            "'reviewer: paper' line per reviewer, [accept], or [reject]."
        )
