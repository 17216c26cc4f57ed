"""`sparring evaluate`: held-out games in self-play, vs a previous checkpoint, vs scripted."""

from __future__ import annotations

import json

import click

from sparring.cli.options import load_config, parse_params
from sparring.games import DEFAULT_GAME, GAMES


@click.command("evaluate")
@click.option("--config", type=click.Path(exists=True, dir_okay=False), help="YAML EvalConfig.")
@click.option(
    "--model", required=True, help="Checkpoint to evaluate (path, hub name, s3:// or models:/)."
)
@click.option("--inits", required=True, type=click.Path(exists=True), help="val game-init parquet.")
@click.option("--previous", help="Checkpoint for the vs_previous mode (seats swapped).")
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Output directory.")
@click.option("--game", type=click.Choice(sorted(GAMES)), help=f"Game (default: {DEFAULT_GAME}).")
@click.option("--num-games", type=int, help="Use the first N val states.")
@click.option("--modes", help="Comma-separated: selfplay,vs_previous,vs_scripted.")
@click.option("--param", "params", multiple=True, metavar="KEY=VALUE", help="Game parameter.")
@click.option("--temperature", type=float, help="Sampling temperature (default 0 = greedy).")
@click.option("--max-new-tokens", type=int, help="Tokens per turn.")
@click.option("--device", default="auto", show_default=True, help="cpu, cuda or auto.")
def command(
    config,
    game,
    model,
    inits,
    previous,
    out,
    num_games,
    modes,
    params,
    temperature,
    max_new_tokens,
    device,
) -> None:
    """Evaluate MODEL on val games; write OUT/metrics.json and OUT/rewards.png, and print its
    reward next to the game's baselines."""
    from sparring.evaluate import EvalConfig, headline, load_and_evaluate, write_eval
    from sparring.models import resolve_model

    overrides = {
        "rollout.game.name": game,
        "num_games": num_games,
        "modes": modes.split(",") if modes else None,
        "rollout.sampling.temperature": temperature,
        "rollout.sampling.max_new_tokens": max_new_tokens,
    }
    overrides |= parse_params(params, "rollout.game.params.")
    cfg = load_config(EvalConfig, config, overrides)
    prev = resolve_model(previous) if previous else None
    metrics, episodes = load_and_evaluate(resolve_model(model), inits, cfg, prev, device)
    paths = write_eval(metrics, episodes, out, cfg.game)
    click.echo(json.dumps({k: round(v, 4) for k, v in headline(metrics).items()}, indent=2))
    click.echo(f"wrote {paths['metrics']} and {paths['plot']}")
