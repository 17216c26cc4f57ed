"""Diplomacy evaluation: the policy against each scripted bot, seated in each country in turn.

    sparring game-init --game diplomacy --param horizon=2 --train 0 --val 4 --out runs/dip-inits
    sparring evaluate --game diplomacy --param horizon=2 --model runs/tiny \\
        --inits runs/dip-inits/val.parquet --modes vs_scripted --out runs/dip-eval

`evaluate` calls `vs_bots` (through `DiplomacyGame.scripted_eval`) for its vs_scripted mode. Every
(val state, bot, country) game seats the policy in that country and the bot in the other six;
all of them are played in ONE batched rollout. Metrics:
    eval/vs_<bot>/<COUNTRY>/<metric>   `metrics.country_metrics` per bot and country
                                       (reward_mean, reward_std, centers, solo_rate, ...)
    eval/vs_<bot>/all/reward_mean      over all countries
    eval/vs_scripted/<COUNTRY>/...     the generic per-role metrics against the default
                                       opponent (EvalConfig.opponent, greedy), as for any game
`write_country_report` turns them into country_table.md and country_heatmap.png
(country x bot, mean reward).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from sparring.evaluate import EvalConfig, seat_metrics
from sparring.games.base import LEARNER
from sparring.games.diplomacy.board import ROLES
from sparring.games.diplomacy.game import DiplomacyGame
from sparring.games.diplomacy.metrics import country_metrics
from sparring.rollout import Episode, Policy, play

BOTS = ("hold", "random-legal", "greedy")
"""Scripted opponents, weakest first."""
KEY_RE = re.compile(r"^eval/vs_(?P<bot>[^/]+)/(?P<country>[A-Z]+)/(?P<metric>\w+)$")


def vs_bots(
    policy: Policy,
    inits: list[tuple[str, dict[str, Any]]],
    cfg: EvalConfig,
    progress: bool = True,
    bots: Sequence[str] | None = None,
) -> tuple[dict[str, float], list[Episode]]:
    """Play `policy` in every country against every bot in `bots` (default: `BOTS` plus
    `cfg.opponent`) on every val state; return the metrics of the module docstring and the
    episodes."""
    bots = list(dict.fromkeys(bots or (*BOTS, cfg.opponent)))
    games = [
        (bot, seat, init_id, state)
        for bot in bots
        for seat in range(len(ROLES))
        for init_id, state in inits
    ]
    plan = [[bot if s != seat else LEARNER for s in range(len(ROLES))] for bot, seat, *_ in games]
    rcfg = cfg.mode_rollout(None)
    policies = {LEARNER: policy, **{bot: DiplomacyGame.make_agent(bot) for bot in bots}}
    # distinct ids per game: the backend keys its KV cache by game id and seat
    runs = [(f"{init_id}/{bot}/{ROLES[seat]}", state) for bot, seat, init_id, state in games]
    episodes = play(runs, policies, rcfg, progress=progress, seat_plan=plan).episodes
    metrics: dict[str, float] = {}
    for bot in bots:
        eps = [e for e, (b, *_) in zip(episodes, games, strict=True) if b == bot]
        for key, value in country_metrics([asdict(e) for e in eps], policy=LEARNER).items():
            metrics[f"eval/vs_{bot}/{key.removeprefix('country/')}"] = value
        mine = [e.rewards[e.seat_policies.index(LEARNER)] for e in eps]
        metrics[f"eval/vs_{bot}/all/reward_mean"] = float(np.mean(mine))
        if bot == cfg.opponent:
            for seat, role in enumerate(ROLES):
                seated = [e for e in eps if e.seat_policies[seat] == LEARNER]
                for name, value in seat_metrics(seated, seat).items():
                    metrics[f"eval/vs_scripted/{role}/{name}"] = value
            metrics["eval/vs_scripted/all/normalized_reward"] = float(np.mean(mine))
    return metrics, episodes


def country_grid(metrics: dict[str, float], metric: str = "reward_mean") -> dict[str, dict]:
    """{bot: {country: value}} of one per-country metric out of flat eval metrics, bots in
    `BOTS` order (weakest first), then any other opponent."""
    grid: dict[str, dict[str, float]] = {}
    for key, value in metrics.items():
        m = KEY_RE.match(key)
        if m and m["metric"] == metric:
            grid.setdefault(m["bot"], {})[m["country"]] = value
    rank = {bot: i for i, bot in enumerate(BOTS)}
    return {bot: grid[bot] for bot in sorted(grid, key=lambda b: (rank.get(b, len(BOTS)), b))}


def write_country_report(metrics: dict[str, float], out_dir: str | Path) -> dict[str, Path]:
    """country_table.md (per bot and country: reward mean +- std, centers, survival and
    invalid-order rate) and country_heatmap.png (country x bot, mean reward)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    grids = {
        m: country_grid(metrics, m)
        for m in ("reward_mean", "reward_std", "centers", "survival_rate", "invalid_order_rate")
    }
    bots = list(grids["reward_mean"])
    lines = ["| country | " + " | ".join(bots) + " |", "|---" * (len(bots) + 1) + "|"]
    for country in ROLES:
        cells = [
            f"{grids['reward_mean'][b][country]:.3f} ± {grids['reward_std'][b][country]:.3f} "
            f"({grids['centers'][b][country]:.1f} SC, surv {grids['survival_rate'][b][country]:.2f}"
            f", inv {grids['invalid_order_rate'][b][country]:.2f})"
            for b in bots
        ]
        lines.append(f"| {country} | " + " | ".join(cells) + " |")
    table = out / "country_table.md"
    table.write_text(
        "Policy reward vs each bot: mean ± std (centers, survival, invalid "
        "rate)\n\n" + "\n".join(lines) + "\n"
    )
    return {"country_table": table, "country_heatmap": plot_heatmap(grids["reward_mean"], out)}


def plot_heatmap(grid: dict[str, dict[str, float]], out_dir: Path) -> Path:
    """Heat map of mean reward, countries down, bots across, values written in the cells."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bots = list(grid)
    values = np.array([[grid[b][c] for b in bots] for c in ROLES])  # (7, bots)
    fig, ax = plt.subplots(figsize=(1.6 * len(bots) + 2, 4.2))
    im = ax.imshow(
        values, cmap="viridis", aspect="auto", vmin=0.0, vmax=max(0.5, float(values.max()))
    )
    ax.set_xticks(range(len(bots)), bots, rotation=15)
    ax.set_yticks(range(len(ROLES)), ROLES)
    for (i, j), v in np.ndenumerate(values):
        ax.text(j, i, f"{v:.2f}", ha="center", va="center", color="w" if v < 0.3 else "k")
    fig.colorbar(im, ax=ax, label="mean reward")
    ax.set_title("policy vs scripted bots, per country")
    fig.tight_layout()
    path = out_dir / "country_heatmap.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
