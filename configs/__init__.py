"""Shipped YAML configs (installed as sparring.configs): the embedded default pipeline, a GPU
pipeline, and trainer/SFT settings."""

from pathlib import Path

CONFIG_DIR = Path(__file__).parent  # the repo's configs/, installed as sparring.configs
