"""The `sparring` command line. Each subcommand lives in its own module in this package and
is a thin caller of a library function; `sparring <command> --help` documents it."""

from __future__ import annotations

import importlib

import click

# Subcommand modules, each exposing a click command or group named `command`.
COMMANDS = (
    "model",
    "game_init",
    "rollout",
    "sft",
    "train",
    "evaluate",
    "compare",
    "run",
    "compile",
    "submit",
    "schema",
)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="sparring")
def main() -> None:
    """Sparring: self-play GRPO for LLM agents on multi-agent language games."""


for _name in COMMANDS:
    main.add_command(importlib.import_module(f"sparring.cli.{_name}").command)
