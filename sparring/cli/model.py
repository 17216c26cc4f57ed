"""`sparring model ...`: build and inspect models."""

from __future__ import annotations

import click


@click.group("model")
def command() -> None:
    """Build local models."""


@command.command("init-tiny")
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Output directory.")
@click.option("--hidden-size", default=128, show_default=True, help="Model width.")
@click.option("--layers", default=4, show_default=True, help="Number of decoder layers.")
@click.option("--seed", default=0, show_default=True, help="Seed for tokenizer corpus and weights.")
def init_tiny_cmd(out: str, hidden_size: int, layers: int, seed: int) -> None:
    """Build a tiny random Qwen2-style model and a locally trained tokenizer (no network)."""
    from sparring.tiny_model import TinyModelConfig, init_tiny

    path = init_tiny(out, TinyModelConfig(hidden_size=hidden_size, num_layers=layers, seed=seed))
    click.echo(f"tiny model written to {path}")
