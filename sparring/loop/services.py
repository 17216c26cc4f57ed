"""Local stand-ins for the services a cluster provides, for `sparring run` and the tests:
a SeaweedFS S3 server and an MLflow server (sqlite, serving artifacts), started only when the
config names none."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from sparring.dev.mlflowserver import MlflowServer
from sparring.dev.s3server import S3Server
from sparring.loop.config import PipelineConfig


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
    and the local S3 data folder (None if S3 or file storage is configured elsewhere).

    MLflow runs as `mlflow server --serve-artifacts` like the chart's (`<workdir>/mlflow`), its
    artifact destination the storage bucket (or folder), so registered checkpoints load through
    the server alone: `MLFLOW_TRACKING_URI` is all a client needs."""
    root = cfg.storage.root
    endpoint = (
        cfg.storage.endpoint_url
        or os.environ.get("AWS_ENDPOINT_URL_S3")
        or os.environ.get("AWS_ENDPOINT_URL")
    )
    with contextlib.ExitStack() as stack:
        data = None
        if root.startswith("s3://") and not endpoint:
            data = workdir / "s3"
            s3 = stack.enter_context(S3Server(data, buckets=[urlparse(root).netloc]))
            stack.enter_context(_env(s3.env()))
            print(f"[sparring] local S3 (SeaweedFS) at {s3.endpoint_url}, data in {data}")
        update: dict[str, Any] = {}
        if not (cfg.tracking.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")):
            destination = (
                f"s3://{urlparse(root).netloc}"
                if root.startswith("s3://")
                else str(Path(root.removeprefix("file://")).resolve())
            )
            server = stack.enter_context(MlflowServer(workdir / "mlflow", destination))
            print(f"[sparring] local MLflow server at {server.url}, artifacts in {destination}")
            update["tracking"] = cfg.tracking.model_copy(
                update={"tracking_uri": server.url, "artifacts_destination": destination}
            )
        yield cfg.model_copy(update=update), data
