"""The matching game (dialop's reviewer-paper "optimization" game): rules and the `dialop`
preset in `game`, tables in `table`, turn parsing in `parse`, what each seat is told in
`prompt`, the scripted baseline in `agents`."""

from sparring.games.matching.game import MatchingGame

__all__ = ["MatchingGame"]
