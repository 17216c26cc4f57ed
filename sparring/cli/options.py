"""Shared CLI plumbing: YAML config files merged with command-line overrides."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import click
import yaml
from pydantic import BaseModel, ValidationError

ConfigT = TypeVar("ConfigT", bound=BaseModel)


NULL = object()
"""An override that sets its field to null (`KEY=null`), unlike None: an option left unset."""


def parse_params(pairs: tuple[str, ...], prefix: str = "") -> dict[str, Any]:
    """`("k=4", "max_turns=20")` -> {"k": 4, "max_turns": 20} (values parsed as YAML; `KEY=null`
    gives `NULL`), each key under `prefix` (e.g. "game.params." for `load_config` overrides)."""
    out = {}
    for pair in pairs:
        if "=" not in pair:
            raise click.BadParameter(f"expected KEY=VALUE, got {pair!r}")
        key, value = pair.split("=", 1)
        parsed = yaml.safe_load(value)
        out[prefix + key.strip()] = NULL if parsed is None else parsed
    return out


def load_config(cls: type[ConfigT], path: str | None, overrides: dict[str, Any]) -> ConfigT:
    """Build `cls` from an optional YAML file plus overrides (None values are ignored).

    Dotted override keys set nested fields: {"sampling.temperature": 0.7}; `NULL` sets a field
    to null (`warm_start=null` drops the warm start). A section given as a plain string in YAML
    (`game: matching`) is its `name`.
    """
    data: dict[str, Any] = {}
    if path:
        loaded = yaml.safe_load(Path(path).read_text()) or {}
        if not isinstance(loaded, dict):
            raise click.BadParameter(f"{path} must hold a YAML mapping", param_hint="--config")
        data = loaded
    for key, value in overrides.items():
        if value is None:
            continue
        node = data
        *parents, leaf = key.split(".")
        for p in parents:
            if isinstance(node.get(p), str):
                node[p] = {"name": node[p]}
            node = node.setdefault(p, {})
        node[leaf] = None if value is NULL else value
    try:
        return cls.model_validate(data)
    except ValidationError as e:
        raise click.UsageError(
            f"invalid {cls.__name__}{f' in {path}' if path else ''}:\n{e}"
        ) from e
