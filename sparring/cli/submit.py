"""`sparring submit`: upload the pipeline to a KFP cluster and start a run (or a campaign)."""

from __future__ import annotations

import math

import click

from sparring.cli.options import load_config


@click.command("submit")
@click.option("--host", required=True, help="KFP API endpoint, e.g. http://ml-pipeline-ui:80.")
@click.option(
    "--config",
    type=click.Path(exists=True, dir_okay=False),
    help="YAML PipelineConfig [default: the embedded configs/pipeline.yaml].",
)
@click.option("--experiment", default="sparring", show_default=True, help="KFP experiment.")
@click.option(
    "--run-name",
    help="Display name of the KFP run and its MLflow parent run; storage keys on the run id "
    "(a campaign's on its campaign id) [default: <name>-it<first>-<last>, made unique].",
)
@click.option("--namespace", help="Kubeflow profile namespace (multi-user installs).")
@click.option(
    "--campaign",
    type=click.IntRange(min=1),
    help="Run this many iterations as consecutive runs of --block iterations [default: the "
    "config's iterations, as a campaign only when they exceed the per-run cap].",
)
@click.option(
    "--block",
    type=click.IntRange(min=1),
    help="Iterations per run of a campaign, at most the per-run cap [default: the cap, "
    "computed from the compiled pipeline's growth so that the Argo Workflow stays under 1 MiB].",
)
@click.option("--timeout", default=86400, show_default=True, help="Seconds to wait for each run.")
@click.option(
    "--service-account",
    help="ServiceAccount the runs use, e.g. the Helm chart's runner (IRSA) [default: KFP's].",
)
def command(
    config, host, experiment, run_name, namespace, campaign, block, timeout, service_account
) -> None:
    """Upload (or version) the pipeline and create a run through kfp.Client.

    One run holds at most the per-run cap of iterations (the unrolled pipeline's Argo Workflow
    must stay under 1 MiB as Argo stores it; sparring.pipelines.workflow_size estimates it from
    two compiles). A config with more iterations, or --campaign N, runs as a campaign:
    consecutive runs of --block iterations, each waited for, every run after the first starting
    from the MLflow champion (models:/<registered_model>@champion), all under one campaign id.
    A run longer than the KFP UI can retry (etcd's 1.5 MiB) is submitted with a warning.
    """
    import kfp

    from sparring.loop.config import DEFAULT_CONFIG, PipelineConfig
    from sparring.pipelines.driver import campaign as run_campaign
    from sparring.pipelines.driver import submit
    from sparring.pipelines.workflow_size import max_iterations, retryable_iterations

    cfg = load_config(PipelineConfig, config or str(DEFAULT_CONFIG), {"run_name": run_name})
    cap = max_iterations(cfg)
    if block is not None and block > cap:
        raise click.BadParameter(
            f"{block} iterations per run is over the cap of {cap} for {cfg.name} (its Argo "
            f"Workflow would pass 1 MiB as stored): give --block {cap} or less, or leave it out",
            param_hint="--block",
        )
    block = block or cap
    total = campaign or cfg.iterations
    retryable = retryable_iterations(cfg)
    if min(block, total) > retryable:
        click.echo(
            f"warning: a run of {min(block, total)} iterations can't be retried from the KFP UI "
            f"(its Workflow passes etcd's 1.5 MiB, kubeflow/pipelines#13738); --campaign "
            f"{total} --block {retryable} keeps each run retryable",
            err=True,
        )
    client = kfp.Client(host=host, namespace=namespace)
    if campaign or total > block:
        if not campaign:
            click.echo(
                f"{total} iterations are over {block} per run (cap {cap}): submitting a "
                f"campaign of {math.ceil(total / block)} runs, each waited for"
            )
        runs = run_campaign(client, cfg, experiment, total, block, timeout, service_account)
        for run in runs:
            click.echo(f"run {run.run_id} done")
    else:
        run = submit(client, cfg, experiment, run_name, service_account)
        click.echo(f"created run {run.run_id}: {host.rstrip('/')}/#/runs/details/{run.run_id}")
