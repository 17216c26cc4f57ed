"""What a run shows people: the evaluation page (HTML, in the KFP UI) and the run summary
(Markdown: one row per iteration, and the champion)."""

from __future__ import annotations

import base64
import html
import json
from pathlib import Path
from typing import Any

from sparring.loop.config import PipelineConfig
from sparring.metrics import ROLLOUT, metric_name, split_eval


def eval_report(
    metrics: dict[str, float], plot: Path, transcripts: Path, iteration: int, turns: int = 8
) -> str:
    """A self-contained HTML page: the reward plot (inline PNG), the reward table and the
    first turns of one sample game per mode."""
    png = base64.b64encode(plot.read_bytes()).decode()
    rows = "".join(
        f"<tr><td>{html.escape(k)}</td><td>{v:.3f}</td></tr>"
        for k, v in sorted(metrics.items())
        if (parts := split_eval(k)) and parts[2] == "normalized_reward"
    )
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
        f"<table border=1><tr><th>metric</th><th>value</th></tr>{rows}</table>"
        f"{''.join(games)}</body></html>"
    )


def run_summary(
    cfg: PipelineConfig, run_name: str, status: str, rows: list[dict[str, Any]], champion: Any
) -> str:
    """The Markdown summary `finish` writes: reward per iteration and the champion."""
    table = "\n".join(
        f"| {r['iteration']} | {r['rollout']:.3f} | {r['score']:.3f} | {r['version']} |"
        for r in rows
    )
    return (
        f"## {run_name}: {status}\n\n| iteration | rollout reward | {cfg.champion_metric} | "
        f"version |\n|---|---|---|---|\n{table}\n\n"
        f"champion: `models:/{cfg.registered_model}@champion` = "
        f"v{champion.version if champion else '-'} ({champion.source if champion else 'none'})\n"
    )


def summary_rows(cfg: PipelineConfig, parent_run_id: str, client: Any) -> list[dict[str, Any]]:
    """Per iteration of the parent run: rollout reward, champion metric, model version, URI."""
    from sparring.tracking import CHECKPOINT_TAG, ITERATION_TAG

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
                "rollout": m.get(metric_name(ROLLOUT, "normalized_reward"), float("nan")),
                "score": m.get(cfg.champion_metric, float("nan")),
                "version": version.version if version else "-",
                "checkpoint": version.tags.get(CHECKPOINT_TAG, version.source) if version else "-",
            }
        )
    return sorted(rows, key=lambda r: r["iteration"])
