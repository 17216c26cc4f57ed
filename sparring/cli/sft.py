"""`sparring sft`: supervised warm start on samples (e.g. scripted self-play)."""

from __future__ import annotations

import click

from sparring.cli.options import load_config
from sparring.cli.train import run_trainer, trainer_options


@click.command("sft")
@trainer_options
def command(config, model, samples, out, device, **overrides) -> None:
    """Fine-tune MODEL on every seat's own replies in SAMPLES; write a checkpoint to OUT.

    Scripted self-play samples: `sparring rollout --seats matching-scripted,matching-scripted
    --tokenizer MODEL ...`.
    """
    from sparring.sft import sft
    from sparring.train_config import SFTConfig

    cfg = load_config(SFTConfig, config, overrides)
    run_trainer(sft, cfg, model, samples, out, device=device)
