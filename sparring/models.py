"""Model references: a local checkpoint path, a hub name, a named model, an S3 URI or an MLflow
model URI.

`resolve_model(ref)` returns something `from_pretrained` accepts: local paths and hub names
pass through; a named model (`tiny`, `smollm2-135m-instruct`, see `sparring.model_zoo`) is
built or fetched and converted on first use, then read from the cache; `models:/name@alias` (or
`models:/name/<version>`) becomes its version's source, and an `s3://…` (or `file://…`)
checkpoint is downloaded into a local cache and checked against its manifest (sha256 of every
file). The cache is keyed by the URI, and a download that did not finish is redone, so a
half-written folder is never loaded.
"""

from __future__ import annotations

import hashlib
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from sparring import model_zoo

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

    from sparring.storage import StorageConfig


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
    if model_zoo.is_named(ref):
        return str(model_zoo.fetch(ref, cache_dir, log=_log))
    if ref.startswith("models:/"):
        from sparring.registry import resolve_model_uri

        ref = resolve_model_uri(ref, client)
    if ref.startswith("file://"):
        ref = ref.removeprefix("file://")
    if ref.startswith(("/", "./", "../", "~")) and not Path(ref).expanduser().exists():
        raise model_zoo.ModelFetchError(f"model {ref!r}: no such file or folder")
    if not ref.startswith("s3://"):
        return ref
    from sparring.storage import download_dir

    target = (
        Path(cache_dir or model_zoo.default_cache_dir())
        / hashlib.sha256(ref.encode()).hexdigest()[:16]
    )
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
