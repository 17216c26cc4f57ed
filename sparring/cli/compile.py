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
    "--kfp-version",
    type=click.Choice(["2.16", "2.17"]),
    help="The KFP backend to target [default: the config's kubernetes.kfp_version].",
)
@click.option(
    "-o", "--output", default="pipeline.yaml", show_default=True, help="Output YAML file."
)
def command(config, iterations, kfp_version, output) -> None:
    """Compile the self-play pipeline (IR YAML) for the KFP UI or `kfp.Client`.

    Compile-time settings (iterations, warm start, images, GPUs, node selector, tolerations,
    S3 Secret, /dev/shm, retries, caching) are baked in; `config`, `games_per_iteration`
    and `group_key` stay run-time parameters. For KFP 2.16 (the default) the IR leaves out
    2.17's run deadline, which a 2.16 API server cannot parse (docs/cluster.md).
    """
    from sparring.loop.config import DEFAULT_CONFIG, PipelineConfig
    from sparring.pipelines.selfplay import compile_pipeline

    overrides = {"iterations": iterations, "kubernetes.kfp_version": kfp_version}
    cfg = load_config(PipelineConfig, config or str(DEFAULT_CONFIG), overrides)
    click.echo(f"wrote {compile_pipeline(cfg, output)} ({cfg.iterations} iterations)")
