"""`sparring run`: the whole self-play loop on this machine, by default the embedded config."""

from __future__ import annotations

import sys

import click

from sparring.cli.options import load_config


@click.command("run")
@click.option(
    "--config",
    type=click.Path(exists=True, dir_okay=False),
    help="YAML PipelineConfig [default: the embedded configs/pipeline.yaml].",
)
@click.option(
    "--model",
    help="Initial model: tiny, a named model (smollm2-135m-instruct), a path, s3:// or models:/.",
)
@click.option("--iterations", type=int, help="Override the number of iterations.")
@click.option("--games-per-iteration", type=int, help="Override the self-play games per iteration.")
@click.option("--run-name", help="Storage folder and MLflow run name [default: <name>-<time>].")
@click.option(
    "--workdir",
    default="runs",
    show_default=True,
    type=click.Path(file_okay=False),
    help="Local folder for the MLflow db, local S3 data, outputs and logs.",
)
@click.option(
    "--kfp",
    is_flag=True,
    help="Run the compiled KFP pipeline under kfp.local (one subprocess per task) instead of "
    "the same loop in this process.",
)
@click.option("-v", "--verbose", is_flag=True, help="Show the full log.")
def command(config, model, iterations, games_per_iteration, run_name, workdir, kfp, verbose):
    """Run the iterative self-play loop on this machine and print a summary.

    With no flags: the embedded default (configs/pipeline.yaml: the tiny model, warm-started
    by SFT on scripted games, then self-play GRPO iterations), a local MLflow server and a
    local SeaweedFS S3 server (started on 127.0.0.1, stopped on exit). Set storage/tracking in
    the config (or the AWS_* / MLFLOW_TRACKING_URI variables) to use real services instead.
    """
    from sparring.loop.config import DEFAULT_CONFIG, PipelineConfig
    from sparring.loop.local import format_summary, in_process, run_local
    from sparring.loop.stop import Stopped

    overrides = {
        "model": model,
        "iterations": iterations,
        "games_per_iteration": games_per_iteration,
        "run_name": run_name,
    }
    cfg = load_config(PipelineConfig, config or str(DEFAULT_CONFIG), overrides)
    if kfp:
        from sparring.pipelines.local import run_kfp as engine
    else:
        engine = in_process
    try:
        result = run_local(cfg, workdir, verbose, engine)
    except RuntimeError as e:
        raise click.ClickException(str(e)) from e
    except Stopped as e:  # local services stopped, MLflow parent run KILLED
        click.echo(f"{e}: MLflow parent run KILLED; partial artifacts in {e.partial}", err=True)
        sys.exit(e.exit_code)
    click.echo(format_summary(result, cfg.champion_metric))
