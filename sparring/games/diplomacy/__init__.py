"""Diplomacy for seven LLM powers over the `diplomacy` engine (optional extra, AGPL-3.0).

board      the engine import and the standard board's constants
scenarios  seeded start positions (opening, midgame, endgame) from scripted play
orders     parsing a power's text into orders and press
observation the board and each power's options, as text
game       the adapter: press and order rounds, retreats, rewards
alliances  each power's allies over the last year played (the `country_alliance` group key)
bots       scripted bots (hold, random-legal, greedy, support) and press teachers
metrics    per-power metrics of plays (seed 001), per country in rollout and evaluation
strategic  the strategic evaluator: scenario sets per dimension, scored per country
report     the evaluation's country table and heatmap (modes include every bot), and the
           strategic evaluator's
"""

from sparring.games.diplomacy.board import ROLES
from sparring.games.diplomacy.game import DiplomacyGame

__all__ = ["ROLES", "DiplomacyGame"]
