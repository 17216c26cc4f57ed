"""The MLflow parent run of one pipeline run: found by the KFP run's unique id, opened once,
ended once, and closed when its KFP run died without its exit handler.

Tags on a parent run: `sparring.kfp_run_id` (the KFP run's uuid, or `sparring run`'s run name),
`sparring.run` (the storage key, `<root>/<run>/…`), `sparring.loop` (the pipeline name),
`kfp.run_name` (the display name, not unique) and `kfp.run_url` (when `kubernetes.kfp_ui_url`
is set). Filters never contain a display name.
"""

from __future__ import annotations

import time
from typing import Any

from sparring.loop.config import PipelineConfig
from sparring.loop.io import log

JOB_TAG = "sparring.kfp_run_id"
RUN_TAG = "sparring.run"
PIPELINE_TAG = "sparring.loop"


def quoted(value: str) -> str:
    """`value` as an MLflow filter string literal (a `'` inside is fine)."""
    if "'" not in value:
        return f"'{value}'"
    if '"' not in value:
        return f'"{value}"'
    raise ValueError(f"{value!r} holds both quote characters; MLflow filters cannot match it")


def _experiment_id(cfg: PipelineConfig, client: Any) -> str | None:
    experiment = client.get_experiment_by_name(cfg.tracking.experiment)
    return experiment.experiment_id if experiment else None


def find_parent(cfg: PipelineConfig, client: Any, job_id: str, tag: str = JOB_TAG) -> Any:
    """The newest parent run whose `tag` (the KFP run id, or the storage key) is `job_id`."""
    experiment_id = _experiment_id(cfg, client)
    found = experiment_id and client.search_runs(
        [experiment_id],
        f"tags.`{tag}` = {quoted(job_id)}",
        max_results=1,
        order_by=["attributes.start_time DESC"],
    )
    return found[0] if found else None


def open_parent(cfg: PipelineConfig, run_name: str, job_id: str, job_name: str = "") -> str:
    """The parent run id of KFP run `job_id`: the one a previous try of `start` opened, else a
    new one (after closing stale ones)."""
    from sparring.tracking import PipelineRun, connect

    client = connect(cfg.tracking)
    if (found := find_parent(cfg, client, job_id)) is not None:
        log(f"KFP run {job_id} already has MLflow parent run {found.info.run_id}: reusing it")
        return found.info.run_id
    close_stale(cfg, client)
    tags = {JOB_TAG: job_id, RUN_TAG: run_name, PIPELINE_TAG: cfg.name}
    if job_name:
        tags["kfp.run_name"] = job_name
    if cfg.kubernetes.kfp_ui_url:
        tags["kfp.run_url"] = f"{cfg.kubernetes.kfp_ui_url.rstrip('/')}/#/runs/details/{job_id}"
    params = cfg.model_dump(mode="json")
    title = cfg.run_name or job_name or run_name
    return PipelineRun.start(cfg.tracking, title, params, tags).run_id


def end(client: Any, parent: Any, status: str) -> None:
    """End `parent` with `status` unless it already ended; a FAILED or KILLED end also ends
    the child runs still open."""
    if status != "FINISHED":
        for child in client.search_runs(
            [parent.info.experiment_id],
            f"tags.mlflow.parentRunId = '{parent.info.run_id}' and attributes.status = 'RUNNING'",
        ):
            client.set_terminated(child.info.run_id, status)
    if client.get_run(parent.info.run_id).info.status == "RUNNING":
        client.set_terminated(parent.info.run_id, status)


def close_stale(cfg: PipelineConfig, client: Any) -> list[str]:
    """KILL this pipeline's parent runs still RUNNING after `kubernetes.run_deadline_seconds`:
    their KFP run is over (the deadline ends it) but skipped its exit handler. Returns their
    ids."""
    experiment_id = _experiment_id(cfg, client)
    if experiment_id is None:
        return []
    cutoff = int((time.time() - cfg.kubernetes.run_deadline_seconds) * 1000)
    stale = client.search_runs(
        [experiment_id],
        f"tags.`{PIPELINE_TAG}` = {quoted(cfg.name)} and attributes.status = 'RUNNING' "
        f"and attributes.start_time < {cutoff}",
    )
    for run in stale:
        client.set_tag(run.info.run_id, "sparring.closed", "stale: past the run deadline")
        end(client, run, "KILLED")
        log(f"closed stale parent run {run.info.run_id} (KFP run {run.data.tags.get(JOB_TAG)})")
    return [run.info.run_id for run in stale]


def link(cfg: PipelineConfig, parent: Any) -> str:
    """A link to `parent` in the MLflow UI (or where to find it for a sqlite store)."""
    uri = cfg.tracking.resolved_uri()
    run_id, experiment_id = parent.info.run_id, parent.info.experiment_id
    if uri.startswith(("http://", "https://")):
        return f"[{run_id}]({uri.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id})"
    return f"{run_id} (`mlflow ui --backend-store-uri {uri}`)"
