"""`sparring game-init`: write seeded initial states (train/val parquet)."""

from __future__ import annotations

import click

from sparring.cli.options import load_config, parse_params


@click.command("game-init")
@click.option("--config", type=click.Path(exists=True, dir_okay=False), help="YAML GameInitConfig.")
@click.option("--game", help="Game name (default: matching).")
@click.option(
    "--param", "params", multiple=True, metavar="KEY=VALUE", help="Game parameter, e.g. k=4."
)
@click.option("--train", "num_train", type=int, help="Number of train states.")
@click.option("--val", "num_val", type=int, help="Number of val states.")
@click.option("--seed", type=int, help="Base seed.")
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Output directory.")
def command(config, game, params, num_train, num_val, seed, out) -> None:
    """Generate seeded initial game states into OUT/train.parquet and OUT/val.parquet."""
    from sparring.game_init import GameInitConfig, write_inits

    overrides = {"game": game, "num_train": num_train, "num_val": num_val, "seed": seed}
    cfg = load_config(GameInitConfig, config, overrides)
    cfg.game_params.update(parse_params(params))
    for split, path in write_inits(cfg, out).items():
        click.echo(f"{split}: {path}")
