"""Checkpoints passed between pipeline steps by reference: the weights go to storage once, and
the step's KFP output artifact holds only `checkpoint.json` (where they are and what they are).

    with produce(cfg, run_uri(cfg, run, i, "checkpoint"), trained.path) as out:  # a producer
        tasks.train(cfg, ..., out, ...)        # writes a HF folder; uploaded once on exit
    with local(model.path, cfg) as model_dir:  # a consumer that loads the weights
        tasks.rollout(cfg, model_dir, ...)     # downloaded into /tmp, deleted on exit

KFP's launcher copies every output artifact into the pipeline root and every input artifact
into the pod (one stream per file, into an unbounded `/s3` scratch volume): with a folder of
weights as the artifact, each checkpoint was stored there again and downloaded by every
consumer, whether it loaded the weights or not. With a reference the launcher moves a few
hundred bytes; only the steps that load the weights download them (streamed to the task's
`/tmp` scratch, a few files at a time, each in parallel parts), and `register` finds the
checkpoint already stored (`sparring.registry.publish(stored=...)`).

Where: a trained checkpoint at `<root>/<run>/<i>/checkpoint` (the registry's own location when
the MLflow server's artifact destination is unknown); the initial and warm-started models at
`<root>/models/<sha256 of their manifest>/checkpoint`, content-addressed, so that a cached
`initial-model` step (its output reused by a later run) still points at its files and a rerun
stores nothing new. A folder without `checkpoint.json` (kfp.local tests that pass folders, the
in-process loop of sparring.loop.runner) is used as it is.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

from sparring import storage
from sparring.loop.config import PipelineConfig
from sparring.loop.io import log, run_uri

REF_FILE = "checkpoint.json"


class Reference(NamedTuple):
    """What a checkpoint artifact holds instead of the weights."""

    uri: str  # the stored checkpoint (a complete sparring.storage upload)
    bytes: int  # its size, every file together
    files: list[storage.FileEntry]  # the HF folder's files (path, size, sha256), as uploaded


def read(ref_dir: str | Path) -> Reference | None:
    """The reference in the artifact folder `ref_dir`, or None if it holds a checkpoint itself."""
    path = Path(ref_dir) / REF_FILE
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    files = [storage.FileEntry(**e) for e in data["files"]]
    return Reference(data["uri"], data["bytes"], files)


def write(ref_dir: str | Path, uri: str, files: list[storage.FileEntry]) -> Reference:
    """Write `checkpoint.json` (uri, bytes, files) into the artifact folder `ref_dir`."""
    ref = Reference(uri, sum(e.size for e in files), files)
    out = Path(ref_dir)
    out.mkdir(parents=True, exist_ok=True)
    data = {"uri": uri, "bytes": ref.bytes, "files": [e.__dict__ for e in files]}
    (out / REF_FILE).write_text(json.dumps(data, indent=1))
    return ref


def publish(
    cfg: PipelineConfig, local_dir: str | Path, uri: str | None, ref_dir: str | Path
) -> Reference:
    """Upload the HF folder `local_dir` to `uri` (write-once: a retried producer's same files
    are a no-op; None = content-addressed under `<root>/models/`) and reference it in
    `ref_dir`."""
    files = storage.scan_dir(local_dir)  # every file hashed once: the name and the upload
    if uri is None:
        digest = hashlib.sha256(repr(files).encode()).hexdigest()[:32]
        uri = f"{cfg.storage.root.rstrip('/')}/models/{digest}/checkpoint"
    config = cfg.storage.client_config()
    files = storage.upload_dir(local_dir, uri, config, write_once=True, entries=files)
    log(f"stored checkpoint {uri} ({sum(e.size for e in files) / 1e9:.2f} GB)")
    return write(ref_dir, uri, files)


@contextmanager
def produce(cfg: PipelineConfig, uri: str | None, ref_dir: str | Path) -> Iterator[Path]:
    """A temporary folder for a step to write its checkpoint into; on a clean exit it is
    published to `uri` (`publish`) and referenced in the output artifact `ref_dir`."""
    with tempfile.TemporaryDirectory(prefix="sparring-out-") as tmp:
        yield Path(tmp)
        publish(cfg, tmp, uri, ref_dir)


def trained(cfg: PipelineConfig, run_name: str, iteration: int, ref_dir: str | Path):
    """`produce` for iteration `iteration`'s trained checkpoint, `<root>/<run>/<i>/checkpoint`."""
    return produce(cfg, run_uri(cfg, run_name, iteration, "checkpoint"), ref_dir)


@contextmanager
def local(artifact: str | Path | None, cfg: PipelineConfig) -> Iterator[str | None]:
    """The checkpoint of the artifact folder `artifact` as a local HF folder: a reference's
    files downloaded into a temporary folder (checked against their sha256, deleted on exit),
    else the folder itself; None (a checkpoint the step does not load) stays None."""
    ref = read(artifact) if artifact is not None else None
    if ref is None:
        yield None if artifact is None else str(artifact)
        return
    with tempfile.TemporaryDirectory(prefix="sparring-ckpt-") as tmp:
        storage.download_dir(ref.uri, tmp, cfg.storage.client_config(), ref.files)
        log(f"downloaded checkpoint {ref.uri} ({ref.bytes / 1e9:.2f} GB)")
        yield tmp


def stored_uri(artifact: str | Path | None) -> str | None:
    """The stored checkpoint an artifact folder references (None for a plain folder)."""
    ref = read(artifact) if artifact else None
    return ref.uri if ref else None
