"""`sparring compile`: write the KFP pipeline YAML for a config."""

from __future__ import annotations

import click

from sparring.cli.options import load_config


@click.command("compile")
@click.option(
    "--config",
    type=click.Path(exists=True, dir_okay=False),
    help="YAML PipelineConfig [default: the embedded configs/pipeline.yaml].",
)
@click.option("--iterations", type=int, help="Override the number of (unrolled) iterations.")
@click.option(
    "-o", "--output", default="pipeline.yaml", show_default=True, help="Output YAML file."
)
def command(config, iterations, output) -> None:
    """Compile the self-play pipeline (IR YAML) for the KFP UI or `kfp.Client`.

    Compile-time settings (iterations, warm start, images, GPUs, node selector, tolerations,
    S3 Secret, /dev/shm, retries, caching) are baked in; `config`, `games_per_iteration`
    and `group_key` stay run-time parameters.
    """
    from sparring.loop.config import DEFAULT_CONFIG, PipelineConfig
    from sparring.pipelines.selfplay import compile_pipeline

    cfg = load_config(PipelineConfig, config or str(DEFAULT_CONFIG), {"iterations": iterations})
    click.echo(f"wrote {compile_pipeline(cfg, output)} ({cfg.iterations} iterations)")
