"""TextArena 0.7.4's Kuhn Poker with its chip accounting fixed (TextArena PR #189, open).

In 0.7.4 a bet or a call never reaches the pot, so every hand is worth one chip and a fold
costs the same as losing a called showdown: betting changes nothing. And after the last hand
it takes one more ante from both players. Here a legal [bet] or [call] moves one chip from
the player into the pot, and no ante is taken once `max_rounds` hands are played: chips are
zero-sum and a hand is worth 1 or 2, as in Kuhn Poker.
"""

from __future__ import annotations

import re

from textarena.envs.KuhnPoker.env import KuhnPokerEnv

MOVE = re.compile(r"\[(Check|Bet|Fold|Call)\]", re.IGNORECASE)  # TextArena's own action pattern


class FixedKuhnPokerEnv(KuhnPokerEnv):
    """KuhnPokerEnv whose bets and calls put a chip in the pot (see the module docstring)."""

    def step(self, action: str):
        game = self.state.game_state
        match = MOVE.search(action.strip())
        move = match.group(1).lower() if match else None
        if move in ("bet", "call") and move in game["current_legal_action_tree"]:
            game["pot"] += 1
            game["player_chips"][self.state.current_player_id] -= 1
        return super().step(action)

    def _init_round(self) -> None:
        game = self.state.game_state
        if game["current_round"] < self.max_rounds:
            super()._init_round()
            return
        chips = game["player_chips"]
        why = f"at the end of all {self.max_rounds} rounds"
        if chips[0] == chips[1]:
            self.state.set_draw(reason=f"Both players had the same number of chips {why}.")
        else:
            winner = 0 if chips[0] > chips[1] else 1
            self.state.set_winner(winner, reason=f"Player {winner} had more chips {why}.")
