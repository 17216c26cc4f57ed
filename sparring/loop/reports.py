"""What a run shows people: the evaluation page (HTML, in the KFP UI) and the run summary
(Markdown: one row per evaluation, from the start's before any update, the champion and the
test figures)."""

from __future__ import annotations

import base64
import html
import json
from pathlib import Path
from typing import Any

from sparring.loop.config import PipelineConfig
from sparring.metrics import (
    EVAL,
    GAIN_OVER_BEST_TRIVIAL,
    ROLLOUT,
    TEST,
    metric_name,
    split_baseline,
    split_eval,
)

REWARD = "normalized_reward"


def eval_report(
    metrics: dict[str, float], plot: Path, transcripts: Path, iteration: int, turns: int = 8
) -> str:
    """A self-contained HTML page: the reward plot (inline PNG), the metrics per mode and role
    (the game's own among them, e.g. a deal game's agreement rate and reward given agreement),
    the baselines with the gain over the best trivial one, and the first turns of one sample
    game per mode."""
    png = base64.b64encode(plot.read_bytes()).decode()
    games = []
    for mode, eps in json.loads(transcripts.read_text()).items():
        for ep in eps[:1]:
            lines = "\n".join(
                f"[seat {t['seat']}] {t.get('text', '')}" for t in ep["transcript"][:turns]
            )
            games.append(
                f"<h3>{html.escape(mode)}: {html.escape(ep['game_id'])} rewards {ep['rewards']}</h3>"
                f"<pre>{html.escape(lines)}</pre>"
            )
    return (
        f"<html><body><h2>Iteration {iteration}: evaluation</h2>"
        f'<img src="data:image/png;base64,{png}"/>'
        f"{eval_table(metrics)}{baseline_table(metrics)}{''.join(games)}</body></html>"
    )


def eval_table(metrics: dict[str, float]) -> str:
    """HTML: a row per mode and role, a column per metric (the reward first), `± s.e.` where
    logged."""
    rows: dict[tuple[str, str], dict[str, str]] = {}
    for k, v in metrics.items():
        if (parts := split_eval(k)) and not k.endswith("_se"):
            se = metrics.get(k + "_se")
            rows.setdefault(parts[:2], {})[parts[2]] = f"{v:.3g}" + (
                f" ± {se:.2g}" if se is not None else ""
            )
    names = sorted({n for row in rows.values() for n in row}, key=lambda n: (n != REWARD, n))
    head = "".join(f"<th>{html.escape(n)}</th>" for n in ["mode", "role", *names])
    body = "".join(
        "<tr>"
        + "".join(f"<td>{html.escape(c)}</td>" for c in [*key, *(row.get(n, "") for n in names)])
        + "</tr>"
        for key, row in sorted(rows.items())
    )
    return f"<table border=1><tr>{head}</tr>{body}</table>"


def baseline_table(metrics: dict[str, float]) -> str:
    """HTML: each baseline's reward on the same states, and the model's gain over the best
    trivial one ('' for a game without baselines)."""
    rows = "".join(
        f"<tr><td>{html.escape(name)}</td><td>{v:.3f} ± {metrics.get(k + '_se', 0):.3f}</td></tr>"
        for k, v in sorted(metrics.items())
        if (name := split_baseline(k))
    )
    gain = metric_name(EVAL, GAIN_OVER_BEST_TRIVIAL)
    line = (
        f"<p>gain over the best trivial baseline: {metrics[gain]:+.3f} ± "
        f"{metrics.get(gain + '_se', 0):.3f} (paired s.e.)</p>"
        if gain in metrics
        else ""
    )
    return (
        f"<h3>baselines</h3><table border=1><tr><th>baseline</th><th>{REWARD}</th></tr>"
        f"{rows}</table>{line}"
        if rows
        else ""
    )


def run_summary(
    cfg: PipelineConfig,
    run_name: str,
    status: str,
    rows: list[dict[str, Any]],
    champion: Any,
    test: dict[str, float],
) -> str:
    """The Markdown summary `finish` writes: reward per iteration (the first row the start's
    with `evaluate_start`), the champion and the test figures."""
    table = "\n".join(
        f"| {iteration_label(cfg, r['iteration'], r['member'])} | {r['rollout']:.3f} | "
        f"{r['score']:.3f} | "
        f"{r['version']} |"
        for r in rows
    )
    return (
        f"## {run_name}: {status}\n\n| iteration | rollout reward | {cfg.champion_metric} | "
        f"version |\n|---|---|---|---|\n{table}\n\n"
        f"champion: `models:/{cfg.registered_model}@champion` = "
        f"v{champion.version if champion else '-'} ({champion.source if champion else 'none'})\n"
        + (f"\n{test_line(cfg, test)}\n" if test else "")
    )


def iteration_label(cfg: PipelineConfig, iteration: int, member: str | None = None) -> str:
    """An evaluation's row label: its iteration, or `start` for the one before any update; a
    member's, `<iteration> <member>`."""
    label = "start" if iteration < cfg.first_iteration else str(iteration)
    return f"{label} {member}" if member else label


def test_line(cfg: PipelineConfig, test: dict[str, float]) -> str:
    """The test figures (`tasks.evaluate_test`) in one sentence."""
    return (
        f"test ({cfg.game_init.num_test} held-out states, once): {cfg.champion_metric} "
        f"{test['test/start']:.3f} at the start, {test['test/final']:.3f} at the end, gain "
        f"{test['test/gain']:+.3f} ± {test['test/gain_se']:.3f} (paired s.e.)"
    )


def test_figures(parent_run_id: str, client: Any) -> dict[str, float]:
    """The parent run's test/* metrics ({} if the run had no test evaluation)."""
    metrics = client.get_run(parent_run_id).data.metrics
    return {k: v for k, v in metrics.items() if k.startswith(f"{TEST}/")}


def summary_rows(cfg: PipelineConfig, parent_run_id: str, client: Any) -> list[dict[str, Any]]:
    """Per child run of the parent run (each iteration's, the start's, which has no rollout
    nor version, and a population member's or the average's own, its `member` named): rollout
    reward, champion metric, model version, URI, and the game's baselines on the same states
    (`eval/baseline/<name>`). In iteration order, an iteration's own run first."""
    from sparring.tracking import CHECKPOINT_TAG, ITERATION_TAG, MEMBER_TAG

    parent = client.get_run(parent_run_id)
    children = client.search_runs(
        [parent.info.experiment_id], f"tags.mlflow.parentRunId = '{parent_run_id}'"
    )
    versions = {
        v.run_id: v for v in client.search_model_versions(f"name = '{cfg.registered_model}'")
    }
    rows = []
    for child in children:
        m, version = child.data.metrics, versions.get(child.info.run_id)
        rows.append(
            {
                "iteration": int(child.data.tags[ITERATION_TAG]),
                "member": child.data.tags.get(MEMBER_TAG),
                "rollout": m.get(metric_name(ROLLOUT, "normalized_reward"), float("nan")),
                "score": m.get(cfg.champion_metric, float("nan")),
                "version": version.version if version else "-",
                "checkpoint": version.tags.get(CHECKPOINT_TAG, version.source) if version else "-",
                "baselines": {b: v for k, v in m.items() if (b := split_baseline(k))},
            }
        )
    return sorted(rows, key=lambda r: (r["iteration"], r["member"] is not None, r["member"] or ""))
