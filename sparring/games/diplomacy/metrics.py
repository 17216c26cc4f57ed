"""Per-power metrics of Diplomacy plays (seed 001's "Country-Specific Metrics").

    power_metrics(plays)   # plays: (games.jsonl episode, seat) pairs

Over the given plays (the game's `episode_metrics`; rollout splits them by country, evaluation
by role, so every metric also exists per country):
    centers             mean supply centers at the end
    solo_rate           share of plays that ended with >= 18 centers
    survival_rate, elimination_rate
    invalid_order_rate  invalid order lines / all order lines written, per play, averaged
    moves               mean movement phases played
"""

from __future__ import annotations

import numpy as np

from sparring.games.base import Play


def power_metrics(plays: list[Play]) -> dict[str, float]:
    """Aggregate Diplomacy plays (see the module docstring for the keys)."""
    rows = []
    for ep, seat in plays:
        out, power = ep["outcome"], ep["roles"][seat]
        stats = out["power_stats"][power]
        written = stats["orders"] + stats["invalid_orders"]
        rows.append(
            {
                "centers": out["centers"][power],
                "solo": out["solo"] == power,
                "eliminated": power in out["eliminated"],
                "invalid_order_rate": stats["invalid_orders"] / written if written else 0.0,
                "moves": out["moves"],
            }
        )
    col = {k: float(np.mean([r[k] for r in rows])) for k in rows[0]}
    return {
        "centers": col["centers"],
        "solo_rate": col["solo"],
        "survival_rate": 1.0 - col["eliminated"],
        "elimination_rate": col["eliminated"],
        "invalid_order_rate": col["invalid_order_rate"],
        "moves": col["moves"],
    }
