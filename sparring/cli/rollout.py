"""`sparring rollout`: batched self-play from game-init states."""

from __future__ import annotations

import json

import click

from sparring.cli.options import load_config, parse_params
from sparring.games import DEFAULT_GAME, GAMES


@click.command("rollout")
@click.option("--config", type=click.Path(exists=True, dir_okay=False), help="YAML RolloutConfig.")
@click.option("--model", help="Policy checkpoint: a local path, hub name or models:/name@alias.")
@click.option("--inits", required=True, type=click.Path(exists=True), help="game-init parquet.")
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Output directory.")
@click.option("--game", type=click.Choice(sorted(GAMES)), help=f"Game (default: {DEFAULT_GAME}).")
@click.option("--limit", type=int, help="Use only the first N initial states.")
@click.option("--games-per-init", type=int, help="Plays per initial state (GRPO group size).")
@click.option(
    "--seats",
    help="Comma-separated policy per seat: `policy` or one of the game's scripted agents.",
)
@click.option("--param", "params", multiple=True, metavar="KEY=VALUE", help="Game parameter.")
@click.option("--temperature", type=float, help="Sampling temperature (0 = greedy).")
@click.option("--max-new-tokens", type=int, help="Tokens per turn.")
@click.option("--seed", type=int, help="Sampling seed.")
@click.option("--device", default="auto", show_default=True, help="cpu, cuda or auto.")
@click.option("--tokenizer", help="Tokenizer for scripted-only rollouts that should write samples.")
def command(
    config,
    game,
    model,
    inits,
    out,
    limit,
    games_per_init,
    seats,
    params,
    temperature,
    max_new_tokens,
    seed,
    device,
    tokenizer,
) -> None:
    """Play self-play games; write OUT/games.jsonl and OUT/samples.parquet."""
    from sparring.models import resolve_model
    from sparring.rollout import RolloutConfig, build_policies, load_inits, play, write_outputs

    overrides = {
        "game.name": game,
        "games_per_init": games_per_init,
        "seats": seats.split(",") if seats else None,
        "sampling.temperature": temperature,
        "sampling.max_new_tokens": max_new_tokens,
        "sampling.seed": seed,
    }
    overrides |= parse_params(params, "game.params.")
    cfg = load_config(RolloutConfig, config, overrides)
    model_path = resolve_model(model) if model else None
    policies = build_policies(
        cfg.game,
        model_path,
        cfg.seats,
        device,
        cfg.max_batch_size,
        backend=cfg.backend,
        temperature=cfg.sampling.temperature,
    )
    scripted_tok = None
    if tokenizer:
        from transformers import AutoTokenizer

        scripted_tok = AutoTokenizer.from_pretrained(resolve_model(tokenizer))
    result = play(load_inits(inits, limit), policies, cfg, scripted_tokenizer=scripted_tok)
    paths = write_outputs(result, out)
    click.echo(json.dumps({k: str(v) for k, v in paths.items()}, indent=2))
    click.echo(paths["stats"].read_text())
