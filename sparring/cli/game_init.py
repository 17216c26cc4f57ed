"""`sparring game-init`: write seeded initial states (train/val/test parquet)."""

from __future__ import annotations

import click

from sparring.cli.options import load_config, parse_params
from sparring.games import DEFAULT_GAME, GAMES


@click.command("game-init")
@click.option("--config", type=click.Path(exists=True, dir_okay=False), help="YAML GameInitConfig.")
@click.option("--game", type=click.Choice(sorted(GAMES)), help=f"Game (default: {DEFAULT_GAME}).")
@click.option(
    "--param", "params", multiple=True, metavar="KEY=VALUE", help="Game parameter, e.g. k=4."
)
@click.option("--train", "num_train", type=int, help="Number of train states.")
@click.option("--val", "num_val", type=int, help="Number of val states.")
@click.option("--test", "num_test", type=int, help="Number of held-out test states.")
@click.option("--seed", type=int, help="Base seed.")
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Output directory.")
def command(config, game, params, num_train, num_val, num_test, seed, out) -> None:
    """Generate seeded initial game states into OUT/{train,val,test}.parquet."""
    from sparring.game_init import GameInitConfig, write_inits

    overrides = {"game.name": game, "num_train": num_train, "num_val": num_val}
    overrides |= {"num_test": num_test, "seed": seed}
    overrides |= parse_params(params, "game.params.")
    cfg = load_config(GameInitConfig, config, overrides)
    for split, path in write_inits(cfg, out).items():
        click.echo(f"{split}: {path}")
