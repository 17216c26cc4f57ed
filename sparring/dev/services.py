"""Local stand-ins for the services a cluster provides, for `sparring run` and the tests:
a SeaweedFS S3 server and MLflow on sqlite, started only when the config names none."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from sparring.dev.s3server import S3Server
from sparring.pipeline.config import PipelineConfig


@contextlib.contextmanager
def _env(values: dict[str, str]) -> Iterator[None]:
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def local_services(
    cfg: PipelineConfig, workdir: Path
) -> Iterator[tuple[PipelineConfig, Path | None]]:
    """Start what `cfg` needs but does not configure (S3, MLflow); yield the completed config
    and the local S3 data folder (None if S3 or file storage is configured elsewhere)."""
    update: dict[str, Any] = {}
    if not (cfg.tracking.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")):
        tracking = cfg.tracking.model_copy(
            update={
                "tracking_uri": f"sqlite:///{workdir / 'mlflow.db'}",
                "artifact_location": (workdir / "mlartifacts").as_uri(),
            }
        )
        update["tracking"] = tracking
    endpoint = (
        cfg.storage.endpoint_url
        or os.environ.get("AWS_ENDPOINT_URL_S3")
        or os.environ.get("AWS_ENDPOINT_URL")
    )
    if not cfg.storage.root.startswith("s3://") or endpoint:
        yield cfg.model_copy(update=update), None
        return
    data = workdir / "s3"
    with S3Server(data, buckets=[urlparse(cfg.storage.root).netloc]) as s3, _env(s3.env()):
        print(f"[sparring] local S3 (SeaweedFS) at {s3.endpoint_url}, data in {data}")
        yield cfg.model_copy(update=update), data
