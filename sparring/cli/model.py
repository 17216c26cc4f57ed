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


@command.command("fetch")
@click.argument("name")
@click.option(
    "--cache-dir",
    type=click.Path(file_okay=False),
    help="Cache root (default: $SPARRING_MODEL_CACHE or <temp>/sparring-models).",
)
def fetch_cmd(name: str, cache_dir: str | None) -> None:
    """Download and convert a named model (e.g. smollm2-135m-instruct) into the cache.

    The first fetch needs the package index; later uses of the name, here or as any --model,
    are offline.
    """
    from sparring import model_zoo

    try:
        path = model_zoo.fetch(name, cache_dir, log=lambda m: click.echo(m, err=True))
    except model_zoo.ModelFetchError as e:
        raise click.ClickException(str(e)) from e
    info = model_zoo.info(path)
    click.echo(f"{info['name']}: {path}")
    click.echo(f"  source:  {info['file']} from the PyPI wheel {info['wheel']}")
    click.echo(f"  params:  {info['params_converted']:,}")
    click.echo(f"  licence: {info['licence']}")
    click.echo(f"  note:    {info['note']}")


@command.command("list")
def list_cmd() -> None:
    """The named models `--model` accepts, and whether each is in the cache."""
    from sparring import model_zoo

    for name, spec in model_zoo.MODELS.items():
        path = model_zoo.find(name)
        state = f"cached at {path}" if path else "not fetched"
        click.echo(f"{name}  ({spec.wheel}, {spec.licence}): {state}")
