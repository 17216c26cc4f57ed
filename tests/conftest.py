"""Shared fixtures. Everything is real and local: a tiny model built here, real servers."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Qwen2-style checkpoint with a locally trained tokenizer (built once)."""
    from sparring.tiny_model import init_tiny

    return init_tiny(tmp_path_factory.mktemp("tiny-model"))
