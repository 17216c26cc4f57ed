"""Per-power metrics of Diplomacy plays (seed 001's "Country-Specific Metrics").

    power_metrics(plays)   # plays: (games.jsonl episode, seat) pairs

Over the given plays (the game's `episode_metrics`; rollout splits them by country, evaluation
by role, and the rollout's rolling summary over each country's last 100 plays, so every metric
also exists per country):
    centers             mean supply centers at the end
    center_gain         mean centers gained over the episode (end - start; negative = lost)
    win_rate            share of plays whose power gained the most centers of the seven, a
                        tie of k powers counting 1/k each, and no win when nobody gained: the
                        win of one short episode (a one-year episode ends with nobody near 18)
    gain_share          the power's gain / the sum of every gaining power's gain (0 when
                        nobody gained): its share of the centers that changed hands
    solo_rate           share of plays that ended with >= 18 centers (about 0 below ~5 years)
    survival_rate, elimination_rate
    invalid_order_rate  invalid order lines / all order lines written, per play, averaged
    moves               mean movement phases played

A self-play batch at parity averages `win_rate` and `gain_share` near 1/7 in every country,
less where a year passes with no gain; above that a country wins more than its share.
"""

from __future__ import annotations

import numpy as np

from sparring.games.base import Play


def center_win(outcome: dict, power: str) -> tuple[float, float]:
    """(win, gain share) of `power` in one episode's outcome (see the module docstring)."""
    gains = {p: n - outcome["start_centers"][p] for p, n in outcome["centers"].items()}
    best = max(gains.values())
    if best <= 0:
        return 0.0, 0.0
    leaders = [p for p, g in gains.items() if g == best]
    win = 1.0 / len(leaders) if power in leaders else 0.0
    return win, max(gains[power], 0) / sum(g for g in gains.values() if g > 0)


def power_metrics(plays: list[Play]) -> dict[str, float]:
    """Aggregate Diplomacy plays (see the module docstring for the keys)."""
    rows = []
    for ep, seat in plays:
        out, power = ep["outcome"], ep["roles"][seat]
        stats = out["power_stats"][power]
        written = stats["orders"] + stats["invalid_orders"]
        win, share = center_win(out, power)
        rows.append(
            {
                "centers": out["centers"][power],
                "center_gain": out["centers"][power] - out["start_centers"][power],
                "win": win,
                "gain_share": share,
                "solo": out["solo"] == power,
                "eliminated": power in out["eliminated"],
                "invalid_order_rate": stats["invalid_orders"] / written if written else 0.0,
                "moves": out["moves"],
            }
        )
    col = {k: float(np.mean([r[k] for r in rows])) for k in rows[0]}
    return {
        "centers": col["centers"],
        "center_gain": col["center_gain"],
        "win_rate": col["win"],
        "gain_share": col["gain_share"],
        "solo_rate": col["solo"],
        "survival_rate": 1.0 - col["eliminated"],
        "elimination_rate": col["eliminated"],
        "invalid_order_rate": col["invalid_order_rate"],
        "moves": col["moves"],
    }
