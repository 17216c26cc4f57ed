"""`sparring schema`: the JSON schema of the config file, or of its recipe or deployment part."""

from __future__ import annotations

import json

import click

PARTS = ("config", "recipe", "deployment")


@click.command("schema")
@click.option(
    "--part",
    type=click.Choice(PARTS),
    default="config",
    show_default=True,
    help="config: the whole file; recipe: what is trained; deployment: where it runs.",
)
def command(part: str) -> None:
    """Print the JSON schema of a config (docs/config.schema.json is the whole file's).

    Editors validate YAML against it, e.g. with `# yaml-language-server: $schema=...`.
    """
    from sparring.loop.config import Deployment, PipelineConfig
    from sparring.recipe import Recipe

    model = {"config": PipelineConfig, "recipe": Recipe, "deployment": Deployment}[part]
    click.echo(json.dumps(model.model_json_schema(), indent=2))
