"""`sparring compare`: several models (registered versions or aliases, paths, bots) side by
side on a game's policy metrics."""

from __future__ import annotations

import os

import click

from sparring.cli.options import load_config, parse_params
from sparring.games import DEFAULT_GAME, GAMES


@click.command("compare")
@click.option("--model", "models", multiple=True, required=True, help="A model (repeat).")
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Output directory.")
@click.option("--game", type=click.Choice(sorted(GAMES)), default=DEFAULT_GAME, show_default=True)
@click.option("--param", "params", multiple=True, metavar="KEY=VALUE", help="Game parameter.")
@click.option("--temperature", type=float, default=0.0, show_default=True, help="0 = greedy.")
@click.option("--device", default="auto", show_default=True, help="cpu, cuda or auto.")
@click.option(
    "--tracking-uri",
    default=lambda: os.environ.get("MLFLOW_TRACKING_URI"),
    help="MLflow server or store to log one run per model to (default: $MLFLOW_TRACKING_URI; "
    "none: nothing is logged).",
)
@click.option("--experiment", default="sparring", show_default=True, help="MLflow experiment.")
def command(models, out, game, params, temperature, device, tracking_uri, experiment) -> None:
    """Read each MODEL's policy metrics (`Game.policy_metrics`); write OUT/comparison.json and
    the game's comparison report, and log them to MLflow."""
    from sparring.compare import compare, log_comparison, write_comparison
    from sparring.games import GameSpec
    from sparring.settings import TrackingConfig

    spec = load_config(GameSpec, None, {"name": game} | parse_params(params, "params."))
    by_model = compare(list(models), spec, temperature, device)
    files = write_comparison(by_model, spec, out)
    for name, path in files.items():
        click.echo(f"{name}: {path}")
    if tracking_uri:
        tracking = TrackingConfig(tracking_uri=tracking_uri, experiment=experiment)
        runs = log_comparison(by_model, list(models), spec, files, tracking)
        click.echo(f"MLflow runs in {experiment!r}: {runs}")
