"""Per-country metrics of Diplomacy episodes (seed 001's "Country-Specific Metrics").

    metrics = country_metrics(episodes, policy="policy")   # episodes: games.jsonl dicts
    mlflow.log_metrics(metrics)

For every country, over the seats that `policy` played (all seats if None):
    country/<C>/episodes          seats counted
    country/<C>/reward_mean, reward_std
    country/<C>/centers           mean supply centers at the end
    country/<C>/solo_rate         share of episodes the country ended with >= 18 centers
    country/<C>/survival_rate, elimination_rate
    country/<C>/invalid_order_rate invalid order lines / all order lines written
    country/<C>/moves             mean movement phases played
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import numpy as np


def country_metrics(
    episodes: Iterable[dict[str, Any]], policy: str | None = None
) -> dict[str, float]:
    """Aggregate Diplomacy episodes per country (see the module docstring for the keys)."""
    rows: dict[str, list[dict[str, float]]] = defaultdict(list)
    for ep in episodes:
        out = ep["outcome"]
        for seat, country in enumerate(ep["roles"]):
            if policy is not None and ep["seat_policies"][seat] != policy:
                continue
            stats = out["power_stats"][country]
            written = stats["orders"] + stats["invalid_orders"]
            rows[country].append(
                {
                    "reward": ep["rewards"][seat],
                    "centers": out["centers"][country],
                    "solo": out["solo"] == country,
                    "eliminated": country in out["eliminated"],
                    "invalid_order_rate": stats["invalid_orders"] / written if written else 0.0,
                    "moves": out["moves"],
                }
            )
    metrics = {}
    for country, seats in sorted(rows.items()):
        col = {k: np.array([r[k] for r in seats], dtype=float) for k in seats[0]}
        metrics |= {
            f"country/{country}/episodes": float(len(seats)),
            f"country/{country}/reward_mean": float(col["reward"].mean()),
            f"country/{country}/reward_std": float(col["reward"].std()),
            f"country/{country}/centers": float(col["centers"].mean()),
            f"country/{country}/solo_rate": float(col["solo"].mean()),
            f"country/{country}/survival_rate": float(1.0 - col["eliminated"].mean()),
            f"country/{country}/elimination_rate": float(col["eliminated"].mean()),
            f"country/{country}/invalid_order_rate": float(col["invalid_order_rate"].mean()),
            f"country/{country}/moves": float(col["moves"].mean()),
        }
    return metrics
