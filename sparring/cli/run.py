"""`sparring run`: the whole self-play loop on this machine, by default the embedded config."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

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
@click.option(
    "--seeds",
    callback=lambda ctx, param, value: [int(s) for v in value for s in v.split(",")],
    multiple=True,
    help="Training seeds, e.g. 0,1,2: one run each, then the test figures' mean and standard "
    "error across seeds beside the evaluation's (needs game_init.num_test > 0).",
)
@click.option("-v", "--verbose", is_flag=True, help="Show the full log.")
def command(config, model, iterations, games_per_iteration, run_name, workdir, kfp, seeds, verbose):
    """Run the iterative self-play loop on this machine and print a summary.

    With no flags: the embedded default (configs/pipeline.yaml: the tiny model, warm-started
    by SFT on scripted games, then self-play GRPO iterations), a local MLflow server and a
    local SeaweedFS S3 server (started on 127.0.0.1, stopped on exit). Set storage/tracking in
    the config (or the AWS_* / MLFLOW_TRACKING_URI variables) to use real services instead.
    For the tiny model and SmolLM2-135M on CPU it first prints a time estimate, scaled to this
    machine by a short probe of the model's own work; it ends with each task's peak memory.
    """
    from sparring.loop.config import DEFAULT_CONFIG, PipelineConfig
    from sparring.loop.local import format_summary, in_process, run_local
    from sparring.loop.replicates import Replicate, format_replicates, seeded, summarize
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
    if seeds and not cfg.game_init.num_test:
        raise click.UsageError("--seeds reports test figures: set game_init.num_test > 0")
    base = cfg.run_name or f"{cfg.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    # the RESULT lines' name: `embedded` for the embedded default, else the config's name
    result_name = "embedded" if config is None else cfg.name.replace("-", "_")
    runs = []
    for seed in seeds or [None]:
        this = cfg if seed is None else seeded(cfg, seed)
        if seed is not None:
            this = this.model_copy(update={"run_name": f"{base}-seed{seed}"})
        try:
            result = run_local(this, workdir, verbose, engine)
        except RuntimeError as e:
            raise click.ClickException(str(e)) from e
        except Stopped as e:  # local services stopped, MLflow parent run KILLED
            if e.partial is None:
                click.echo(f"{e} outside the loop's tasks: the local services stopped", err=True)
            else:
                click.echo(
                    f"{e}: MLflow parent run KILLED; partial artifacts in {e.partial}", err=True
                )
            sys.exit(e.exit_code)
        click.echo(format_summary(result, this, result_name))
        runs.append(Replicate(seed, result.run_name, result.test))
    if seeds:
        summary = summarize(runs)
        path = Path(workdir) / f"{base}-seeds.json"
        path.write_text(json.dumps(summary | {"config": cfg.model_dump(mode="json")}, indent=1))
        click.echo(f"{format_replicates(summary, cfg.champion_metric)}\nsummary: {path}")
