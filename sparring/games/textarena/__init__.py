"""TextArena's two-player games (optional extra `sparring[textarena]`, MIT) as Sparring games.

env     the adapter: a TextArena environment behind the `Game` interface (state, seeding,
        chat, the `ok` contract, rewards in [0, 1], win/draw/forfeit metrics)
games   the registered games: Kuhn Poker, Tic-Tac-Toe, SimpleNegotiation
agents  their baselines: a random-legal agent and one scripted agent per game
"""

from sparring.games.textarena.games import KuhnPoker, SimpleNegotiation, TicTacToe

__all__ = ["KuhnPoker", "SimpleNegotiation", "TicTacToe"]
