"""Where a run's files live in storage, and the progress lines tasks print.

Layout: `<storage.root>/<run>/{config,inits,initial}` and
`<storage.root>/<run>/<iteration>/{rollout,checkpoint,eval,verl}`.
"""

from __future__ import annotations

from pathlib import Path

from sparring import storage
from sparring.loop.config import PipelineConfig


def log(message: str) -> None:
    """A progress line (`sparring run` shows lines with this prefix)."""
    print(f"[sparring] {message}", flush=True)


def run_uri(cfg: PipelineConfig, run_name: str, *parts: int | str) -> str:
    """`<storage.root>/<run>/<parts…>`, e.g. `s3://sparring/runs/r1/0/checkpoint`."""
    return "/".join([cfg.storage.root.rstrip("/"), run_name, *map(str, parts)])


def upload(cfg: PipelineConfig, local_dir: str | Path, uri: str) -> str:
    """Upload a folder with its manifest (sparring.storage) and log where it went. A
    `…/checkpoint` prefix is write-once (a model version may point at it): the same files
    again are a no-op, other files fail with AlreadyStoredError."""
    write_once = uri.rstrip("/").endswith("/checkpoint")
    storage.upload_dir(local_dir, uri, cfg.storage.client_config(), write_once=write_once)
    log(f"uploaded {uri}")
    return uri
