"""`sparring train`: one GRPO update of a checkpoint on rollout samples."""

from __future__ import annotations

import json
from collections.abc import Callable

import click

from sparring.cli.options import load_config

SUMMARY = (
    "train/loss",
    "train/pg_clipfrac",
    "train/kl",
    "train/entropy",
    "train/grad_norm",
    "train/frac_reward_zero_std",
    "perf/train_tokens_per_second",
)


def trainer_options(f: Callable) -> Callable:
    """Options shared by `sparring train` and `sparring sft` (each overrides the YAML config)."""
    options = [
        click.option(
            "--config",
            type=click.Path(exists=True, dir_okay=False),
            help="YAML config (GRPOConfig: configs/train.yaml; SFTConfig: configs/sft.yaml).",
        ),
        click.option(
            "--model", required=True, help="Start checkpoint (path, hub, s3://, models:/)."
        ),
        click.option(
            "--samples",
            required=True,
            multiple=True,
            type=click.Path(exists=True),
            help="Samples parquet from `sparring rollout` (repeatable).",
        ),
        click.option(
            "--out",
            required=True,
            type=click.Path(file_okay=False),
            help="Output checkpoint directory (also gets metrics.json).",
        ),
        click.option("--lr", type=float, help="AdamW learning rate."),
        click.option("--epochs", type=int, help="Passes over the samples."),
        click.option("--mini-batch-size", type=int, help="Sequences per optimizer step."),
        click.option("--micro-batch-size", type=int, help="Sequences per forward/backward."),
        click.option("--max-seq-len", type=int, help="Cut longer samples to this many tokens."),
        click.option("--seed", type=int, help="Shuffling and torch seed."),
        click.option("--device", default="auto", show_default=True, help="cpu, cuda or auto."),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def run_trainer(fn: Callable, cfg, model: str, samples: tuple[str, ...], out: str, **kw) -> None:
    """Call `fn` (train or sft), turning data and config errors into one-line CLI errors."""
    from sparring.models import resolve_model

    try:
        stats = fn(resolve_model(model), list(samples), out, cfg, **kw)
    except ValueError as e:  # missing columns, empty or all-zero-advantage batches, ...
        raise click.ClickException(str(e)) from e
    click.echo(json.dumps({k: round(v, 4) for k, v in stats.metrics.items() if k in SUMMARY}))
    click.echo(f"wrote {stats.out_dir} (metrics.json inside)")


@click.command("train")
@trainer_options
@click.option("--group-key", help="GRPO group: game, init, role, batch or any samples column.")
@click.option("--kl-coef", type=float, help="KL(policy || reference) weight; 0 = off.")
@click.option("--clip-ratio", type=float, help="PPO clip epsilon.")
@click.option("--loss-agg-mode", help="verl agg_loss mode, e.g. token-mean, seq-mean-token-mean.")
@click.option("--ref-model", help="Reference policy for KL (default: --model).")
def command(config, model, samples, out, ref_model, device, **overrides) -> None:
    """GRPO-train MODEL on SAMPLES; write a HF checkpoint and metrics.json to OUT."""
    from sparring.models import resolve_model
    from sparring.train import train
    from sparring.train_config import GRPOConfig

    cfg = load_config(GRPOConfig, config, overrides)
    ref = resolve_model(ref_model) if ref_model else None
    run_trainer(train, cfg, model, samples, out, ref_model_path=ref, device=device)
