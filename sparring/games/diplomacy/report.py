"""Diplomacy's evaluation report: per country and eval mode, out of the flat eval metrics.

    sparring game-init --game diplomacy --param horizon=2 --train 0 --val 4 --out runs/dip-inits
    sparring evaluate --game diplomacy --param horizon=2 --model runs/tiny \\
        --inits runs/dip-inits/val.parquet --modes vs_scripted --out runs/dip-eval

`evaluate` plays the lineups `DiplomacyGame.eval_lineups` declares: for `vs_scripted`, the
policy in each country in turn against the default opponent (greedy) in the other six, and
against each other bot as mode `vs_<bot>` (`vs_hold`, `vs_random-legal`), all in one batched
rollout. Its metrics `eval/<mode>/<COUNTRY>/<metric>` hold the generic ones (normalized_reward
and its standard error, invalid_rate, ...) and `metrics.power_metrics` (centers, solo_rate,
survival_rate, invalid_order_rate, ...). `write_country_report` turns them into
country_table.md and country_heatmap.png (country x mode, mean reward). Where the strategic
evaluator ran (`strategic.py`), `write_strategic_report` adds strategic_table.md and
strategic_heatmap.png (per dimension, country x model); `sparring compare` writes them for
several models side by side.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from sparring.games.diplomacy.board import ROLES
from sparring.games.diplomacy.bots import BOTS
from sparring.games.diplomacy.strategic import DIMENSIONS, PREFIX, PRIMARY
from sparring.metrics import EVAL, VS_SCRIPTED, split_eval

ORDER = [f"vs_{bot}" for bot in BOTS] + [VS_SCRIPTED]
"""Columns first: the bots weakest first, then the default opponent; other modes follow."""


def country_grid(metrics: dict[str, float], metric: str = "normalized_reward") -> dict[str, dict]:
    """{mode: {country: value}} of one per-country metric out of flat eval metrics, modes in
    `ORDER`, then any other."""
    grid: dict[str, dict[str, float]] = {}
    for key, value in metrics.items():
        parts = split_eval(key)
        if parts and parts[1] in ROLES and parts[2] == metric:
            grid.setdefault(parts[0], {})[parts[1]] = value
    rank = {mode: i for i, mode in enumerate(ORDER)}
    return {m: grid[m] for m in sorted(grid, key=lambda m: (rank.get(m, len(ORDER)), m))}


def write_country_report(metrics: dict[str, float], out_dir: str | Path) -> dict[str, Path]:
    """country_table.md (per mode and country: reward mean +- standard error, centers,
    survival and invalid-order rate) and country_heatmap.png (country x mode, mean reward)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    columns = ("normalized_reward", "normalized_reward_se", "centers", "survival_rate")
    reward, se, centers, survival, invalid = (
        country_grid(metrics, m) for m in (*columns, "invalid_order_rate")
    )
    modes = list(reward)
    lines = ["| country | " + " | ".join(modes) + " |", "|---" * (len(modes) + 1) + "|"]
    for c in ROLES:
        cells = [
            f"{reward[m][c]:.3f} ± {se[m][c]:.3f} ({centers[m][c]:.1f} SC, "
            f"surv {survival[m][c]:.2f}, inv {invalid[m][c]:.2f})"
            for m in modes
        ]
        lines.append(f"| {c} | " + " | ".join(cells) + " |")
    table = out / "country_table.md"
    table.write_text(
        "Policy reward per eval mode: mean ± s.e. (centers, survival, invalid "
        "rate)\n\n" + "\n".join(lines) + "\n"
    )
    return {"country_table": table, "country_heatmap": plot_heatmap(reward, out)}


def plot_heatmap(grid: dict[str, dict[str, float]], out_dir: Path) -> Path:
    """Heat map of mean reward, countries down, modes across, values written in the cells."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = list(grid)
    values = np.array([[grid[m][c] for m in modes] for c in ROLES])  # (7, modes)
    fig, ax = plt.subplots(figsize=(1.6 * len(modes) + 2, 4.2))
    im = ax.imshow(
        values, cmap="viridis", aspect="auto", vmin=0.0, vmax=max(0.5, float(values.max()))
    )
    ax.set_xticks(range(len(modes)), modes, rotation=15)
    ax.set_yticks(range(len(ROLES)), ROLES)
    for (i, j), v in np.ndenumerate(values):
        ax.text(j, i, f"{v:.2f}", ha="center", va="center", color="w" if v < 0.3 else "k")
    fig.colorbar(im, ax=ax, label="mean reward")
    ax.set_title("policy per country and eval mode")
    fig.tight_layout()
    path = out_dir / "country_heatmap.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


# ---- the strategic evaluator -------------------------------------------------------------------
ROWS = (*ROLES, "all")


def strategic_cells(metrics: dict[str, float]) -> dict[tuple[str, str, str], float]:
    """{(dimension, country or `all`, metric): value} of the strategic evaluator's metrics
    (`eval/strategic/...` from an evaluation, or `strategic/...`)."""
    cells = {}
    for key, value in metrics.items():
        parts = key.removeprefix(f"{EVAL}/").split("/")
        if len(parts) == 4 and parts[0] == PREFIX:
            cells[parts[1], parts[2], parts[3]] = value
    return cells


def write_strategic_report(
    by_model: dict[str, dict[str, float]], out_dir: str | Path
) -> dict[str, Path]:
    """strategic_table.md: per dimension, its `PRIMARY` metric per country (rows, `all`
    last) and model (columns), mean ± standard error over scenarios (games); and
    strategic_heatmap.png, one panel per dimension, countries x models."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cells = {m: strategic_cells(v) for m, v in by_model.items()}
    models = list(cells)
    dims = [d for d in DIMENSIONS if any((d, "all", "games") in c for c in cells.values())]
    lines = ["Strategic evaluator: mean ± s.e. over scenarios (games) per country and model.", ""]
    for d in dims:
        lines += [f"**{d}** ({PRIMARY[d]})", "", "| country | " + " | ".join(models) + " |"]
        lines.append("|---" * (len(models) + 1) + "|")
        for row in ROWS:
            lines.append(f"| {row} | " + " | ".join(_cell(cells[m], d, row) for m in models) + " |")
        lines.append("")
    table = out / "strategic_table.md"
    table.write_text("\n".join(lines))
    return {"strategic_table": table, "strategic_heatmap": _strategic_heatmap(cells, dims, out)}


def _cell(cells: dict[tuple[str, str, str], float], dim: str, row: str) -> str:
    metric = PRIMARY[dim]
    if (dim, row, metric) not in cells:
        return "-"
    se = cells.get((dim, row, f"{metric}_se"), 0.0)
    return f"{cells[dim, row, metric]:+.2f} ± {se:.2f} ({cells[dim, row, 'games']:.0f})"


def _strategic_heatmap(cells: dict[str, dict], dims: list[str], out_dir: Path) -> Path:
    """One panel per dimension: its primary metric, countries down, models across."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(cells)
    fig, axes = plt.subplots(
        1, len(dims), figsize=(len(dims) * (1.0 * len(models) + 1.6) + 0.6, 4.2), squeeze=False
    )
    for ax, d in zip(axes[0], dims, strict=True):
        values = np.array(
            [[cells[m].get((d, row, PRIMARY[d]), np.nan) for m in models] for row in ROWS]
        )  # (8, models)
        top = max(float(np.nanmax(np.abs(values))), 0.5) if np.isfinite(values).any() else 1.0
        ax.imshow(values, cmap="RdBu", vmin=-top, vmax=top, aspect="auto")
        ax.set_xticks(range(len(models)), models, rotation=30, ha="right", fontsize=8)
        ax.set_yticks(range(len(ROWS)), ROWS if ax is axes[0][0] else [""] * len(ROWS))
        for (i, j), v in np.ndenumerate(values):
            if np.isfinite(v):
                ax.text(j, i, f"{v:+.1f}", ha="center", va="center", fontsize=8)
        ax.set_title(f"{d}\n{PRIMARY[d]}", fontsize=9)
    fig.tight_layout()
    path = out_dir / "strategic_heatmap.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
