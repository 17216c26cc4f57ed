"""The adapter: one TextArena two-player environment behind Sparring's `Game` interface.

A subclass names a TextArena environment (`env_id`, played as its `-raw` variant: no wrappers)
and its rule parameters; this class turns the environment into a Sparring game:
- State: `generate_state(seed)` = {seed, env_id, params, game_state}. `reset` replays
  TextArena's own seeded reset and checks it reproduces the stored `game_state`, so the same
  seed gives the same game (and a state from another TextArena version fails clearly).
- Randomness: TextArena draws from the global `random` module (`random.seed` in reset, shuffles
  between Kuhn Poker rounds). Each game keeps its own copy of that generator's state and swaps
  it in around every environment call, so games interleaved in one rollout stay reproducible
  and nothing else's randomness moves.
- Chat: a seat's first observation (TextArena's prompt) is its system message; every later
  observation it receives becomes user text (`[GAME] ...`, `[Player 1] ...`); its own actions
  are its assistant messages. A seat to move with nothing new to read is told `Your move.`;
  a subclass may end every decision's observation with a `cue` (Kuhn Poker's card, restated).
- The `ok` contract: TextArena marks an invalid move by asking the same player again (up to
  `max_retries` times, TextArena's `error_allowance`); then the player forfeits, and in
  TextArena that loses the game: `ok=False, forfeited=True`, and the game is over.
- Rewards: TextArena's outcome (+1 win, 0 draw, -1 loss) mapped to [0, 1]: 1 win, 0.5 draw,
  0 loss (`win_rewards`; a game may score otherwise, as Kuhn Poker's chips). A game cut
  before its end (rollout context limit) gives 0 to both seats.
"""

from __future__ import annotations

import json
import random
from contextlib import contextmanager
from typing import Any, ClassVar

import textarena as ta

from sparring.games.base import Game, GameStats, Play, StepResult, TurnRecord

ROLES = ("player_0", "player_1")


def _jsonable(value: Any) -> Any:
    """`value` as it reads back from JSON (int dict keys become strings)."""
    return json.loads(json.dumps(value))


class TextArenaGame(Game):
    """A TextArena two-player environment as a Sparring game (see the module docstring)."""

    env_id: ClassVar[str]
    """TextArena's registry id, e.g. "KuhnPoker-v0" (played as "<env_id>-raw")."""
    default_group_key = "init_seat"  # one winner per game: the two seats' rewards differ
    roles = ROLES

    def __init__(self, max_retries: int = 1, **env_params: Any) -> None:
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        self.max_retries = max_retries
        self.env_params = env_params
        self.state: dict[str, Any] | None = None

    # ---- state and randomness --------------------------------------------------------------
    def generate_state(self, seed: int) -> dict[str, Any]:
        env, _ = self._fresh_env(int(seed))
        return {
            "seed": int(seed),
            "env_id": self.env_id,
            "params": _jsonable(self.env_params),
            "game_state": _jsonable(env.state.game_state),
        }

    def _fresh_env(self, seed: int) -> tuple[ta.Env, Any]:
        """A new environment reset with `seed`, and its generator state after the reset."""
        env = self._new_env()
        outer = random.getstate()
        try:
            env.reset(num_players=2, seed=seed)
            return env, random.getstate()
        finally:
            random.setstate(outer)

    def _new_env(self) -> ta.Env:
        """A fresh environment with this game's rules (a subclass may patch TextArena's)."""
        return ta.make(f"{self.env_id}-raw", **self.env_params)

    @contextmanager
    def _own_rng(self):
        """Run environment code on this game's generator state, then restore the caller's."""
        outer = random.getstate()
        random.setstate(self._rng)
        try:
            yield
        finally:
            self._rng = random.getstate()
            random.setstate(outer)

    # ---- lifecycle -------------------------------------------------------------------------
    def reset(self, state: dict[str, Any]) -> None:
        mine = {"env_id": self.env_id, "params": _jsonable(self.env_params)}
        theirs = {"env_id": state.get("env_id"), "params": state.get("params")}
        if theirs != mine:
            raise ValueError(f"this state was generated for {theirs}, but this game is {mine}")
        self.state = state
        self._env, self._rng = self._fresh_env(state["seed"])
        if _jsonable(self._env.state.game_state) != state["game_state"]:
            raise ValueError(
                f"TextArena {ta.__version__} deals seed {state['seed']} differently from the "
                "TextArena that generated this state; regenerate the states (game-init)"
            )
        self._env.state.error_allowance = self.max_retries
        self._turn = 0
        self._seen = [0, 0]  # observations already forwarded into each seat's chat
        self._transcript: list[TurnRecord] = []
        self._stats = GameStats([0, 0], [0, 0], [0, 0])
        self._chat = [[], []]
        self._forward()

    @property
    def pending_seats(self) -> list[int]:
        return [] if self.done else [self._env.state.current_player_id]

    @property
    def done(self) -> bool:
        return bool(self._env.state.done)

    @property
    def rewards(self) -> list[float]:
        return self.win_rewards

    @property
    def win_rewards(self) -> list[float]:
        """TextArena's outcome in [0, 1]: 1 win, 0.5 draw, 0 loss (0 for both before the end)."""
        if not self.done:
            return [0.0, 0.0]
        outcome = self._env.state.rewards
        return [min(max((float(outcome[s]) + 1) / 2, 0.0), 1.0) for s in range(2)]

    def outcome(self) -> dict[str, Any]:
        st = self._env.state
        rewards = self.win_rewards
        forfeit = [s for s in range(2) if st.game_info[s]["invalid_move"]]
        return {
            "finished": self.done,
            "winner": rewards.index(1.0) if 1.0 in rewards else None,
            "draw": self.done and rewards == [0.5, 0.5],
            "forfeit": forfeit[0] if forfeit else None,
            "reason": st.game_info[0].get("reason"),
        }

    # ---- the move --------------------------------------------------------------------------
    def _act(self, seat: int, text: str) -> StepResult:
        st = self._env.state
        errors, seen = st.error_count, len(st.observations[seat])
        with self._own_rng():
            self._env.step(text)
        forfeited = self.done and bool(st.game_info[seat]["invalid_move"])
        rejected = forfeited or st.error_count > errors
        error = self._invalid_reason(seat, seen) if rejected else None
        self._transcript.append(
            TurnRecord(self._turn, seat, text, not rejected, error, None, forfeited)
        )
        self._stats.invalid_actions[seat] += rejected
        self._stats.forfeits[seat] += forfeited
        if forfeited or not rejected:
            self._turn += 1
        self._forward()
        if forfeited:
            self._tell(seat, f"[GAME] Invalid move again ({error}). You forfeit the game.")
            self._tell(1 - seat, f"[GAME] Player {seat} forfeits the game by invalid moves.")
        return StepResult(ok=not rejected, error=error, forfeited=forfeited)

    def _invalid_reason(self, seat: int, seen: int) -> str:
        """TextArena's reason for `seat`'s invalid move (its admin message, or the game's)."""
        admin = [
            message
            for _, message, kind in self._env.state.observations[seat][seen:]
            if kind == ta.ObservationType.GAME_ADMIN
        ]
        if admin:
            return admin[-1].split("Reason: ", 1)[-1].split(" Please resubmit", 1)[0]
        return str(self._env.state.game_info[seat].get("reason") or "invalid move")

    def _forward(self) -> None:
        """Move each seat's new TextArena observations into its chat (see the module doc)."""
        for seat in range(2):
            observations = self._env.state.observations[seat]
            for sender, message, kind in observations[self._seen[seat] :]:
                if kind == ta.ObservationType.PROMPT and not self._chat[seat]:
                    self._chat[seat].append({"role": "system", "content": message})
                elif not (sender == seat and kind == ta.ObservationType.PLAYER_ACTION):
                    name = "GAME" if sender == ta.GAME_ID else f"Player {sender}"
                    self._tell(seat, f"[{name}] {message}")
            self._seen[seat] = len(observations)
        for seat in self.pending_seats:
            if self._chat[seat][-1]["role"] != "user":
                self._tell(seat, "[GAME] Your move.")
            cue = self.cue(seat)
            if cue and not self._chat[seat][-1]["content"].endswith(cue):
                self._tell(seat, cue)

    def cue(self, seat: int) -> str | None:
        """A line that ends `seat`'s observation at each of its decisions (None: no line)."""
        return None

    # ---- for agents and metrics ------------------------------------------------------------
    @property
    def game_state(self) -> dict[str, Any]:
        """TextArena's live game state (agents read only what their seat may see)."""
        return self._env.state.game_state

    def legal_moves(self, seat: int) -> list[str]:
        """Texts that are legal moves for `seat` now (a finite choice for random agents)."""
        raise NotImplementedError

    @classmethod
    def episode_metrics(cls, plays: list[Play]) -> dict[str, float]:
        """Win, draw and forfeit rates of the plays' seats."""
        n = len(plays)
        return {
            "win_rate": sum(e["outcome"]["winner"] == s for e, s in plays) / n,
            "draw_rate": sum(bool(e["outcome"]["draw"]) for e, _ in plays) / n,
            "forfeit_rate": sum(e["outcome"]["forfeit"] == s for e, s in plays) / n,
        }
