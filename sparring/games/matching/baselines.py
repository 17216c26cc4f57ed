"""The matching game's baselines (`MatchingGame.baselines`): what a deal is worth without
skill, without communication, and with full information.

The deal baselines are exact: one seat proposes, the partner accepts at once, and the reward is
the deal's true value over the best value, read off the state with no game played.
- `random_deal`: a uniformly random assignment. Over all k! assignments each cell is used in
  (k-1)! of them, so the mean value is the table's sum / k.
- `identity_deal`: reviewer i gets paper i (the names as listed).
- `own_view_deal`: a seat proposes its best assignment from its own cells alone, an unseen cell
  counting 50 (the generator's rule, `own_best_values`); the mean over which seat proposes.
- `no_communication_ceiling`: the better of the two own-view proposals, the most any policy
  can reach without using the conversation.
The scripted full-information agent (`matching-scripted` in both seats) is played through the
game: it shares its cells, then proposes the best assignment of what it has heard.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def random_deal(state: dict[str, Any]) -> float:
    """Mean normalized reward of a uniformly random assignment."""
    return float(np.sum(state["table"])) / state["k"] / state["best_value"]


def identity_deal(state: dict[str, Any]) -> float:
    """Normalized reward of reviewer i -> paper i."""
    return float(np.trace(state["table"])) / state["best_value"]


def own_view_deal(state: dict[str, Any]) -> float:
    """Normalized reward of one seat's own-view best, averaged over the proposing seat."""
    return float(np.mean(state["own_best_values"])) / state["best_value"]


def no_communication_ceiling(state: dict[str, Any]) -> float:
    """Normalized reward of the better seat's own-view best."""
    return max(state["own_best_values"]) / state["best_value"]
