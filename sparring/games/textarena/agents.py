"""Baseline agents for the TextArena games. Each reads only what its seat may see: its own
card, resources and values, the board, the moves offered to it.

RandomLegalAgent    any game: a uniformly random legal move, seeded by (game seed, seat, move
                    number), so replaying a game replays its moves
KuhnPokerAgent      bets or calls with a K, checks then calls with a Q, checks then folds with a J
TicTacToeAgent      wins if it can, else blocks, else takes the centre, a corner, an edge
PerfectTicTacToeAgent  minimax: never loses; wins soonest, loses latest; ties by centre, corners
NegotiationAgent    accepts offers worth more to it than they cost; otherwise offers the trade
                    with the smallest gain for itself (the likeliest to be accepted)
"""

from __future__ import annotations

import functools
import random
from typing import Any

from sparring.games.textarena.env import TextArenaGame
from sparring.games.textarena.games import KuhnPoker, SimpleNegotiation, TicTacToe

LINES = [(0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6)]
PREFERENCE = [4, 0, 2, 6, 8, 1, 3, 5, 7]  # centre, corners, edges


class RandomLegalAgent:
    """A uniformly random legal move (`game.legal_moves(seat)`)."""

    def act(self, game: TextArenaGame, seat: int) -> str:
        rng = random.Random(f"{game.state['seed']}/{seat}/{len(game.transcript)}")
        return rng.choice(game.legal_moves(seat))


class KuhnPokerAgent:
    """A value strategy: no bluffs, calls only with Q or K."""

    def act(self, game: KuhnPoker, seat: int) -> str:
        legal = game.legal_moves(seat)
        card = game.card(seat)
        if "[bet]" in legal:  # nobody has bet
            return "[bet]" if card == "K" else "[check]"
        return "[call]" if card in "QK" else "[fold]"


class TicTacToeAgent:
    """Win, block, then centre, corners, edges."""

    def act(self, game: TicTacToe, seat: int) -> str:
        cells = game.cells()
        free = [i for i, c in enumerate(cells) if not c]
        for mark in (game.mark(seat), game.mark(1 - seat)):  # win first, then block
            for line in LINES:
                marks = [cells[i] for i in line]
                if marks.count(mark) == 2 and marks.count("") == 1:
                    return f"[{line[marks.index('')]}]"
        return f"[{next(i for i in PREFERENCE if i in free)}]"


class PerfectTicTacToeAgent:
    """Minimax over the whole game tree (5478 positions, cached): the move of best `value`,
    the first in `PREFERENCE` order among equals."""

    def act(self, game: TicTacToe, seat: int) -> str:
        cells, mark = tuple(game.cells()), game.mark(seat)
        free = [i for i in PREFERENCE if not cells[i]]
        return f"[{max(free, key=lambda i: -value(_put(cells, i, mark), _other(mark)))}]"


@functools.cache
def value(cells: tuple[str, ...], mark: str) -> int:
    """The position's value for `mark`, to move, under perfect play by both: 0 a draw, +(empty
    cells + 1) after a win, -(empty cells + 1) after a loss (a sooner win is worth more)."""
    if any(all(cells[i] == _other(mark) for i in line) for line in LINES):
        return -(cells.count("") + 1)  # the previous move won
    free = [i for i, c in enumerate(cells) if not c]
    return max((-value(_put(cells, i, mark), _other(mark)) for i in free), default=0)


def _put(cells: tuple[str, ...], i: int, mark: str) -> tuple[str, ...]:
    return cells[:i] + (mark,) + cells[i + 1 :]


def _other(mark: str) -> str:
    return "O" if mark == "X" else "X"


class NegotiationAgent:
    """Trades only for gain by its own values."""

    max_quantity = 3  # largest quantity per side it considers offering or asking

    def act(self, game: SimpleNegotiation, seat: int) -> str:
        own, values = game.resources(seat), game.values(seat)
        offer = game.offer_to(seat)
        if offer is not None:
            gain = _worth(offer["offered_resources"], values) - _worth(
                offer["requested_resources"], values
            )
            affordable = all(own.get(r, 0) >= q for r, q in offer["requested_resources"].items())
            if gain > 0 and affordable:
                return "[Accept]"
        trades = [
            (n_get * values[get] - n_give * values[give], n_give, give, n_get, get)
            for give in own
            for get in own
            if get != give
            for n_give in range(1, min(own[give], self.max_quantity) + 1)
            for n_get in range(1, self.max_quantity + 1)
        ]
        gain, n_give, give, n_get, get = min(t for t in trades if t[0] > 0)
        deny = "[Deny] " if offer is not None else ""
        return f"{deny}[Offer: {n_give} {give} -> {n_get} {get}]"


def _worth(resources: dict[str, Any], values: dict[str, int]) -> int:
    return sum(q * values[r] for r, q in resources.items())
