"""`sparring submit`: upload the pipeline to a KFP cluster and start a run (or a campaign)."""

from __future__ import annotations

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
@click.option("--campaign", type=int, help="Run this many iterations as consecutive runs.")
@click.option("--block", default=10, show_default=True, help="Iterations per run of a campaign.")
@click.option("--timeout", default=86400, show_default=True, help="Seconds to wait for each run.")
@click.option(
    "--service-account",
    help="ServiceAccount the runs use, e.g. the Helm chart's runner (IRSA) [default: KFP's].",
)
def command(
    config, host, experiment, run_name, namespace, campaign, block, timeout, service_account
) -> None:
    """Upload (or version) the pipeline and create a run through kfp.Client.

    With --campaign N, submit N iterations as runs of --block iterations each; every run after
    the first starts from the MLflow champion (models:/<registered_model>@champion).
    """
    import kfp

    from sparring.loop.config import DEFAULT_CONFIG, PipelineConfig
    from sparring.pipelines.driver import campaign as run_campaign
    from sparring.pipelines.driver import submit

    cfg = load_config(PipelineConfig, config or str(DEFAULT_CONFIG), {"run_name": run_name})
    client = kfp.Client(host=host, namespace=namespace)
    if campaign:
        runs = run_campaign(client, cfg, experiment, campaign, block, timeout, service_account)
        for run in runs:
            click.echo(f"run {run.run_id} done")
    else:
        run = submit(client, cfg, experiment, run_name, service_account)
        click.echo(f"created run {run.run_id}: {host.rstrip('/')}/#/runs/details/{run.run_id}")
