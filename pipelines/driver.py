"""Submitting the pipeline to a KFP cluster: one run, or a campaign of runs.

    sparring submit --host http://kfp.example --config configs/pipeline-gpu.yaml
    sparring submit --host http://kfp.example --config configs/pipeline-gpu.yaml --campaign 40 --block 10

A campaign is longer than one pipeline should hold (the unrolled IR grows ~26 KB per
iteration): it submits one run per block of iterations, waits for it, and starts the next
block from the MLflow champion (`models:/<registered_model>@champion`). Every block shares one
`run_name`, so the storage layout `<root>/<run>/<iteration>/…` continues across blocks, and
so does the opponents' difficulty schedule: a block's first rollout reads the schedule.json the
last rollout stored (sparring.pipeline.league).
"""

import tempfile
from pathlib import Path

from sparring.pipelines.selfplay import compile_pipeline

from sparring.pipeline.config import PipelineConfig


def submit(
    client,
    cfg: PipelineConfig,
    experiment: str,
    run_name: str | None = None,
    service_account: str | None = None,
):
    """Compile `cfg`, upload it as a new version of the pipeline `cfg.name` (creating the
    pipeline on first use) and start a run in `experiment`. Returns the KFP run.

    Args:
        client: a `kfp.Client`.
        cfg: the pipeline config (compile-time settings included).
        experiment: KFP experiment name (created if missing).
        run_name: KFP run name; default `<cfg.name>-it<first>-<last>`.
        service_account: ServiceAccount of the run's pods; None = KFP's default runner.
    """
    last = cfg.first_iteration + cfg.iterations - 1
    run_name = run_name or f"{cfg.name}-it{cfg.first_iteration}-{last}"
    with tempfile.TemporaryDirectory() as tmp:
        package = compile_pipeline(cfg, str(Path(tmp) / "pipeline.yaml"))
        pipeline_id = client.get_pipeline_id(cfg.name)
        if pipeline_id is None:
            pipeline_id = client.upload_pipeline(package, cfg.name).pipeline_id
        version = client.upload_pipeline_version(package, run_name, pipeline_id=pipeline_id)
    experiment_id = client.create_experiment(experiment).experiment_id  # returns existing ones
    return client.run_pipeline(
        experiment_id,
        run_name,
        pipeline_id=pipeline_id,
        version_id=version.pipeline_version_id,
        service_account=service_account,
    )


def campaign(
    client,
    cfg: PipelineConfig,
    experiment: str,
    total: int,
    block: int,
    timeout: int,
    service_account: str | None = None,
):
    """Run `total` iterations as ceil(total / block) consecutive runs; each run after the first
    starts from the champion. Returns the KFP runs. Stops at the first run that fails."""
    runs = []
    run_name = cfg.run_name or cfg.name
    for first in range(cfg.first_iteration, cfg.first_iteration + total, block):
        model = cfg.model if not runs else f"models:/{cfg.registered_model}@champion"
        size = min(block, cfg.first_iteration + total - first)
        part = cfg.model_copy(
            update={
                "model": model,
                "first_iteration": first,
                "iterations": size,
                "run_name": run_name,
                "warm_start": cfg.warm_start if not runs else None,
            }
        )
        run = submit(client, part, experiment, service_account=service_account)
        runs.append(run)
        done = client.wait_for_run_completion(run.run_id, timeout)
        if str(done.state).upper() != "SUCCEEDED":
            raise RuntimeError(f"campaign stopped: run {run.run_id} ended {done.state}")
    return runs
