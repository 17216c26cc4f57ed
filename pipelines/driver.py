"""Submitting the pipeline to a KFP cluster: one run, or a campaign of runs.

    sparring submit --host http://kfp.example --config configs/pipeline-gpu.yaml
    sparring submit --host http://kfp.example --config configs/pipeline-gpu.yaml --campaign 40

One run holds at most `max_iterations(cfg)` iterations: the unrolled pipeline's Argo Workflow
grows with every iteration and must stay under 1 MiB (sparring.pipelines.workflow_size;
docs/results.md#compiled-ir-size). A longer run is a campaign: it submits one run per block of
at most that many iterations, waits for it, and starts the next block from the MLflow champion
(`models:/<registered_model>@champion`). Every block shares one
fresh campaign id `<name>-<uuid>` (`campaign`, the storage key), so the storage layout
`<root>/<campaign>/<iteration>/…` continues across blocks, and so do the opponents' difficulty
schedule and `past-<k>`: a block's first rollout reads the schedule.json the last rollout
stored (sparring.loop.league). Two campaigns of one pipeline never share a key; a run outside
a campaign is keyed on its KFP run id. `run_name` is only a display name.
"""

import hashlib
import json
import tempfile
import time
import uuid
from pathlib import Path

from sparring.pipelines.selfplay import compile_pipeline
from sparring.pipelines.workflow_size import max_iterations

from sparring.loop.config import PipelineConfig


def version_name(cfg: PipelineConfig, package: str | Path) -> str:
    """`<cfg.name>-<sha256 of the compiled package, 12 hex>`: the same pipeline is the same
    version (KFP requires unique version names), a changed one a new version."""
    digest = hashlib.sha256(Path(package).read_bytes()).hexdigest()[:12]
    return f"{cfg.name}-{digest}"


def unique_run_name(base: str) -> str:
    """`<base>-<UTC time>-<4 hex>`: display names of runs never repeat (storage and MLflow key on
    the run's id anyway)."""
    return f"{base}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{uuid.uuid4().hex[:4]}"


def _version(client, cfg: PipelineConfig, package: str) -> tuple[str, str]:
    """(pipeline id, version id) of `package`: an identical version is reused."""
    name = version_name(cfg, package)
    pipeline_id = client.get_pipeline_id(cfg.name)
    if pipeline_id is None:  # its first version is this package, named after the pipeline
        pipeline_id = client.upload_pipeline(package, cfg.name).pipeline_id
        first = client.list_pipeline_versions(pipeline_id).pipeline_versions[0]
        return pipeline_id, first.pipeline_version_id
    query = {"predicates": [{"key": "name", "operation": "EQUALS", "string_value": name}]}
    found = client.list_pipeline_versions(pipeline_id, filter=json.dumps(query))
    if found.pipeline_versions:
        return pipeline_id, found.pipeline_versions[0].pipeline_version_id
    version = client.upload_pipeline_version(package, name, pipeline_id=pipeline_id)
    return pipeline_id, version.pipeline_version_id


def submit(
    client,
    cfg: PipelineConfig,
    experiment: str,
    run_name: str | None = None,
    service_account: str | None = None,
):
    """Compile `cfg`, find or upload it as a version of the pipeline `cfg.name` (named by its
    content hash) and start a run in `experiment`. Returns the KFP run. Caching is never
    overridden at submit time: the compiled per-task settings hold (side-effect tasks never
    cache).

    Args:
        client: a `kfp.Client`.
        cfg: the pipeline config (compile-time settings included).
        experiment: KFP experiment name (created if missing).
        run_name: KFP run (display) name; default `<cfg.name>-it<first>-<last>`, made unique.
        service_account: ServiceAccount of the run's pods; None = KFP's default runner.
    """
    last = cfg.first_iteration + cfg.iterations - 1
    run_name = run_name or unique_run_name(f"{cfg.name}-it{cfg.first_iteration}-{last}")
    with tempfile.TemporaryDirectory() as tmp:
        package = compile_pipeline(cfg, str(Path(tmp) / "pipeline.yaml"))
        pipeline_id, version_id = _version(client, cfg, package)
    experiment_id = client.create_experiment(experiment).experiment_id  # returns existing ones
    return client.run_pipeline(
        experiment_id,
        run_name,
        pipeline_id=pipeline_id,
        version_id=version_id,
        service_account=service_account,
    )


def blocks(first: int, total: int, block: int) -> list[tuple[int, int]]:
    """(first_iteration, iterations) of each run of a campaign: `total` iterations from `first`
    in runs of `block`, the last one shorter."""
    return [(i, min(block, first + total - i)) for i in range(first, first + total, block)]


def campaign(
    client,
    cfg: PipelineConfig,
    experiment: str,
    total: int,
    block: int | None = None,
    timeout: int = 86400,
    service_account: str | None = None,
):
    """Run `total` iterations as ceil(total / block) consecutive runs under one campaign id (a
    new `<name>-<uuid>`, or `cfg.campaign` to continue that campaign); each run after the first
    starts from the champion. `block` defaults to the per-run cap, `max_iterations(cfg)`.
    Returns the KFP runs. Stops at the first run that fails."""
    runs = []
    block = block or max_iterations(cfg)
    campaign_id = cfg.campaign or f"{cfg.name}-{uuid.uuid4().hex}"
    for first, size in blocks(cfg.first_iteration, total, block):
        model = cfg.model if not runs else f"models:/{cfg.registered_model}@champion"
        part = cfg.model_copy(
            update={
                "model": model,
                "first_iteration": first,
                "iterations": size,
                "campaign": campaign_id,
                "warm_start": cfg.warm_start if not runs else None,
            }
        )
        run = submit(client, part, experiment, service_account=service_account)
        runs.append(run)
        done = client.wait_for_run_completion(run.run_id, timeout)
        if str(done.state).upper() != "SUCCEEDED":
            raise RuntimeError(f"campaign stopped: run {run.run_id} ended {done.state}")
    return runs
