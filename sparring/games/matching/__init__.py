"""The matching game (dialop's reviewer-paper "optimization" game): rules in `game`, tables in
`table`, turn parsing in `parse`, the scripted baseline in `agents`."""

from sparring.games.matching.game import MatchingGame

__all__ = ["MatchingGame"]
