"""The TextArena games Sparring registers: each names its environment, its rule parameters,
its legal moves (for the random agent) and its scripted agents.

Rules are TextArena's own (its prompts say them to the players):
- Kuhn Poker: a 3-card deck (J < Q < K), ante 1, one card each, [check]/[bet]/[call]/[fold]
  (a bet or call adds 1 chip); most chips after `max_rounds` hands wins. Player 1 opens the
  first hand, then the opener alternates.
- Tic-Tac-Toe: Player 0 is O and moves first, Player 1 is X; a move is `[cell]` (0-8).
- SimpleNegotiation: both hold random stocks of five resources with private values;
  `[Offer: 2 Wheat -> 1 Ore]`, `[Accept]`, `[Deny]`; after `max_turns` turns the larger gain in
  inventory value wins.
"""

from __future__ import annotations

from typing import Any

import textarena as ta

from sparring.games.base import Baseline, Play, PlayGames
from sparring.games.textarena.env import TextArenaGame
from sparring.games.textarena.kuhn import FixedKuhnPokerEnv
from sparring.metrics import VS_SCRIPTED


def scripted_and_random(name: str, scripted: str) -> dict[str, str]:
    """`<name>-scripted` (the agents module's `scripted` class) and `<name>-random`."""
    module = "sparring.games.textarena.agents"
    return {
        f"{name}-scripted": f"{module}:{scripted}",
        f"{name}-random": f"{module}:RandomLegalAgent",
    }


RANKS = {"J": "lowest", "Q": "middle", "K": "highest"}
"""Kuhn Poker's cards by rank, as `card_rank` names them."""


class KuhnPoker(TextArenaGame):
    """TextArena's KuhnPoker-v0 (SPIRAL's main training game), its chip accounting fixed
    (`sparring.games.textarena.kuhn`)."""

    name = "kuhn-poker"
    env_id = "KuhnPoker-v0"
    agents = scripted_and_random("kuhn-poker", "KuhnPokerAgent") | {
        "kuhn-poker-call": "sparring.games.textarena.exploitability:AlwaysCallAgent",
        "kuhn-poker-nash": "sparring.games.textarena.exploitability:NashAgent",
        "kuhn-poker-exploiter": "sparring.games.textarena.exploitability:ExploiterAgent",
    }
    learner_agents = frozenset({"kuhn-poker-exploiter"})
    default_opponent = "kuhn-poker-scripted"
    reads_policy_table = True

    def __init__(
        self,
        max_rounds: int = 3,
        max_retries: int = 1,
        reward: str = "win",
        restate_card: bool = False,
        card_rank: bool = False,
    ) -> None:
        if max_rounds < 1:
            raise ValueError(f"max_rounds must be >= 1, got {max_rounds}")
        if reward not in ("win", "chips"):
            raise ValueError(f"unknown reward {reward!r}; choose 'win' or 'chips'")
        self.reward = reward
        """`win`: TextArena's outcome (1 win, 0.5 draw, 0 loss); `chips`: the chips won,
        (chips + 2 max_rounds) / (4 max_rounds), so a hand's value counts as in Kuhn Poker
        (a forfeit still scores 0, and the other seat 1)."""
        self.restate_card = restate_card
        """End every decision's observation with `[GAME] Your card: K.` (TextArena says the
        card once, when the hand is dealt, hundreds of tokens before a late decision)."""
        self.card_rank = card_rank
        """With `restate_card`, name the card's rank too: `[GAME] Your card: K, the highest
        card.` (the tiny model's tokenizer writes J and Q as two rare single letters)."""
        super().__init__(max_retries, max_rounds=max_rounds)

    @classmethod
    def turn_budget(cls, params: dict[str, Any]) -> int:
        """Three moves per hand at most (check, bet, call)."""
        return 3 * cls(**params).env_params["max_rounds"]

    def _new_env(self) -> ta.Env:
        return FixedKuhnPokerEnv(**self.env_params)

    def card(self, seat: int) -> str:
        """The seat's own card this hand: J, Q or K."""
        return "JQK"[self.game_state["player_cards"][seat]]

    def legal_moves(self, seat: int) -> list[str]:
        if seat not in self.pending_seats:
            return []
        return [f"[{move}]" for move in self.game_state["current_legal_action_tree"]]

    def cue(self, seat: int) -> str | None:
        """`[GAME] Your card: K.` with `restate_card` (`K, the highest card.` with
        `card_rank`)."""
        if not self.restate_card:
            return None
        card = self.card(seat)
        rank = f", the {RANKS[card]} card" if self.card_rank else ""
        return f"[GAME] Your card: {card}{rank}."

    @property
    def rewards(self) -> list[float]:
        won = self.win_rewards
        forfeit = any(info["invalid_move"] for info in self._env.state.game_info.values())
        if self.reward == "win" or not self.done or forfeit:
            return won
        rounds, chips = self.env_params["max_rounds"], self.game_state["player_chips"]
        return [(chips[seat] + 2 * rounds) / (4 * rounds) for seat in range(2)]

    def outcome(self) -> dict[str, Any]:
        chips = self.game_state["player_chips"]
        return super().outcome() | {"chips": [chips[0], chips[1]]}

    @classmethod
    def baselines(cls) -> tuple[Baseline, ...]:
        """Against the scripted opponent, in the learner's seats: uniform random and
        always-call (trivial) and the Nash equilibrium (the reference), played."""
        return (
            Baseline("kuhn-poker-random", VS_SCRIPTED, trivial=True, agent="kuhn-poker-random"),
            Baseline("kuhn-poker-call", VS_SCRIPTED, trivial=True, agent="kuhn-poker-call"),
            Baseline("kuhn-poker-nash", VS_SCRIPTED, trivial=False, agent="kuhn-poker-nash"),
        )

    def policy_metrics(
        self, policy: Any, temperature: float, play: PlayGames | None = None
    ) -> dict[str, float]:
        """`exploitability` and `card_dependence` of the policy read out at the 12
        information sets of one hand, the table itself (`p_bet/<information state>`: the
        probability of bet or call there), and `exploitability/<baseline>` of the baselines'
        tables beside it (`sparring.games.textarena.exploitability`)."""
        from sparring.games.textarena import exploitability as kuhn

        table = kuhn.read_policy(policy, self, temperature)
        tables = {"kuhn-poker-random": kuhn.UNIFORM, "kuhn-poker-call": kuhn.ALWAYS_CALL}
        tables["kuhn-poker-nash"] = kuhn.NASH
        own = {"exploitability": kuhn.exploitability(table)}
        own["card_dependence"] = kuhn.card_dependence(table)
        own |= {f"p_bet/{state}": row["Bet"] for state, row in table.items()}
        return own | {
            f"exploitability/{name}": kuhn.exploitability(t) for name, t in tables.items()
        }

    def average_rows(
        self,
        tokenizer: Any,
        iterates: list[dict[str, float]],
        temperature: float,
        weights: list[float],
    ) -> list[dict[str, Any]]:
        """Both replies at each of the 12 information sets, weighted by the exact mixture of
        the iterates' tables (`exploitability.mixture`, `imitation_rows`)."""
        from sparring.games.textarena import exploitability as kuhn

        mixed = kuhn.mixture([kuhn.table(m) for m in iterates], weights)
        return kuhn.imitation_rows(tokenizer, self, mixed, temperature)


class TicTacToe(TextArenaGame):
    """TextArena's TicTacToe-v0."""

    name = "tic-tac-toe"
    env_id = "TicTacToe-v0"
    agents = scripted_and_random("tic-tac-toe", "TicTacToeAgent") | {
        "tic-tac-toe-perfect": "sparring.games.textarena.agents:PerfectTicTacToeAgent"
    }
    default_opponent = "tic-tac-toe-scripted"

    def __init__(self, max_retries: int = 1) -> None:
        super().__init__(max_retries)

    @classmethod
    def turn_budget(cls, params: dict[str, Any]) -> int:
        """Nine cells."""
        return 9

    @classmethod
    def baselines(cls) -> tuple[Baseline, ...]:
        """Against the scripted opponent, in the learner's seats, played: a random legal move
        (trivial) and minimax (`tic-tac-toe-perfect`, never loses; the reference)."""
        return (
            Baseline("tic-tac-toe-random", VS_SCRIPTED, trivial=True, agent="tic-tac-toe-random"),
            Baseline(
                "tic-tac-toe-perfect", VS_SCRIPTED, trivial=False, agent="tic-tac-toe-perfect"
            ),
        )

    @staticmethod
    def mark(seat: int) -> str:
        return "X" if seat == 1 else "O"

    def cells(self) -> list[str]:
        """The board as 9 cells ('', 'O' or 'X'), row by row."""
        return [c for row in self.game_state["board"] for c in row]

    def legal_moves(self, seat: int) -> list[str]:
        if seat not in self.pending_seats:
            return []
        return [f"[{i}]" for i, c in enumerate(self.cells()) if not c]

    def outcome(self) -> dict[str, Any]:
        return super().outcome() | {"board": self.cells()}


class SimpleNegotiation(TextArenaGame):
    """TextArena's SimpleNegotiation-v0 (a resource-trading negotiation)."""

    name = "simple-negotiation"
    env_id = "SimpleNegotiation-v0"
    agents = scripted_and_random("simple-negotiation", "NegotiationAgent")
    default_opponent = "simple-negotiation-scripted"

    def __init__(self, max_turns: int = 10, max_retries: int = 1) -> None:
        if max_turns < 2:
            raise ValueError(f"max_turns must be >= 2, got {max_turns}")
        super().__init__(max_retries, max_turns=max_turns)

    @classmethod
    def turn_budget(cls, params: dict[str, Any]) -> int:
        """`max_turns` + 1: TextArena checks the limit before it counts the move."""
        return cls(**params).env_params["max_turns"] + 1

    @classmethod
    def episode_metrics(cls, plays: list[Play]) -> dict[str, float]:
        """The win, draw and forfeit rates, and `agreement_rate`: the share of plays whose game
        traded at least once."""
        agreed = sum(bool(e["outcome"]["agreed"]) for e, _ in plays) / len(plays)
        return super().episode_metrics(plays) | {"agreement_rate": agreed}

    def resources(self, seat: int) -> dict[str, int]:
        return dict(self.game_state["player_resources"][seat])

    def values(self, seat: int) -> dict[str, int]:
        """The seat's private value of one unit of each resource."""
        return dict(self.game_state["player_values"][seat])

    def offer_to(self, seat: int) -> dict[str, Any] | None:
        """The standing offer made to `seat` (offered/requested resources), if any."""
        offer = self.game_state["current_offer"]
        return offer if offer and offer["to_player"] == seat else None

    def legal_moves(self, seat: int) -> list[str]:
        """[Accept] when an affordable offer stands, [Deny], and every 1-for-1 offer."""
        if seat not in self.pending_seats:
            return []
        own = self.resources(seat)
        moves = ["[Deny]"]
        offer = self.offer_to(seat)
        if offer and all(own.get(r, 0) >= q for r, q in offer["requested_resources"].items()):
            moves.append("[Accept]")
        moves += [
            f"[Offer: 1 {give} -> 1 {get}]"
            for give in own
            if own[give] > 0
            for get in own
            if get != give
        ]
        return moves

    def outcome(self) -> dict[str, Any]:
        trades = [t for t in self.game_state["trade_history"] if t["outcome"] == "Accepted"]
        gains = [self.game_state["inventory_value"][s]["change"] for s in range(2)]
        return super().outcome() | {"agreed": bool(trades), "trades": len(trades), "gains": gains}
