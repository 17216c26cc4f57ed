"""Model references: a local checkpoint path, a hub name, a named model, an S3 URI or an MLflow
model URI.

`resolve_model(ref)` returns something `from_pretrained` accepts: local paths and hub names
pass through; a named model (`smollm2-135m-instruct`, see `sparring.model_zoo`) is fetched and
converted on first use, then read from the cache; `models:/name@alias` (or
`models:/name/<version>`) becomes its version's source, and an `s3://…` (or `file://…`)
checkpoint is downloaded into a local cache and checked against its manifest (sha256 of every
file). The cache is keyed by the URI, and a download that did not finish is redone, so a
half-written folder is never loaded.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

    from sparring.storage import StorageConfig

CACHE_ENV = "SPARRING_MODEL_CACHE"  # overrides the default cache folder


def default_cache_dir() -> Path:
    """$SPARRING_MODEL_CACHE, else `<system temp>/sparring-models`."""
    return Path(os.environ.get(CACHE_ENV) or Path(tempfile.gettempdir()) / "sparring-models")


def resolve_model(
    ref: str,
    cache_dir: str | Path | None = None,
    storage_config: StorageConfig | None = None,
    client: MlflowClient | None = None,
) -> str:
    """A local path or hub name for `ref` (see module docstring).

    `storage_config` reaches the S3 server that holds `s3://` checkpoints (None = the AWS
    variables); `client` is the registry that resolves `models:/` (None = the default one).
    """
    from sparring import model_zoo

    if model_zoo.is_named(ref):
        return str(model_zoo.fetch(ref, cache_dir, log=_log))
    if ref.startswith("models:/"):
        from sparring.tracking import resolve_model_uri

        ref = resolve_model_uri(ref, client)
    if ref.startswith("file://"):
        ref = ref.removeprefix("file://")
    if not ref.startswith("s3://"):
        return ref
    from sparring.storage import download_dir

    target = Path(cache_dir or default_cache_dir()) / hashlib.sha256(ref.encode()).hexdigest()[:16]
    done = target / ".complete"
    if not done.exists():
        shutil.rmtree(target, ignore_errors=True)
        download_dir(
            ref, target, storage_config
        )  # raises VerifyError on a missing manifest or bad sha256
        done.write_text(ref)
    return str(target)


def _log(msg: str) -> None:
    print(f"[sparring.models] {msg}", file=sys.stderr, flush=True)
