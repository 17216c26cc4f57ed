"""Model references: a local checkpoint path, a hub name, an S3 URI or an MLflow model URI.

`resolve_model(ref)` returns something `from_pretrained` accepts: local paths and hub names
pass through; `s3://…` and `models:/name@alias` are fetched into a local cache first.
"""

from __future__ import annotations

from pathlib import Path


def resolve_model(ref: str, cache_dir: str | Path | None = None) -> str:
    """A local path or hub name for `ref` (see module docstring)."""
    if ref.startswith(("s3://", "models:/")):
        raise NotImplementedError(f"remote model references are not wired yet: {ref}")
    return ref
