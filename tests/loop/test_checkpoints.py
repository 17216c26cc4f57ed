"""Checkpoints by reference (sparring.loop.checkpoints) on a real SeaweedFS server: the KFP
artifact holds no weights and resolves to the same files; a retried producer or register
stores nothing twice; register stages the MLflow model beside the stored weights, or copies
them inside S3 into the logged model's folder and later drops the pipeline's copy."""

from __future__ import annotations

import uuid
from pathlib import Path
from urllib.parse import urlparse

import pytest

from sparring import storage
from sparring.loop import checkpoints, tasks
from sparring.loop.config import PipelineConfig
from sparring.loop.io import run_uri
from sparring.registry import stage_mlflow_model
from sparring.tracking import CHECKPOINT_TAG, PipelineRun, connect

EVALS = {"eval/selfplay/all/normalized_reward": 0.5}


def _cfg(tracking: dict) -> PipelineConfig:
    tag = uuid.uuid4().hex[:6]
    return PipelineConfig.model_validate(
        {
            "game": {"params": {"k": 3}},
            "storage": {"root": f"s3://sparring/ckpt-{tag}"},
            "tracking": tracking,
            "registered_model": f"ckpt-{tag}",
            "champion_metric": "eval/selfplay/all/normalized_reward",
        }
    )


@pytest.fixture
def s3_env(s3_server, monkeypatch):
    for key, value in s3_server.env().items():
        monkeypatch.setenv(key, value)
    return s3_server


def objects(uri: str) -> dict[str, int]:
    """Every object under `uri` (relative key -> size), straight from the S3 server."""
    parsed = urlparse(uri)
    client = storage.StorageConfig.from_env().client()
    pages = client.get_paginator("list_objects_v2").paginate(
        Bucket=parsed.netloc, Prefix=parsed.path.strip("/") + "/"
    )
    base = len(parsed.path.strip("/")) + 1
    return {o["Key"][base:]: o["Size"] for page in pages for o in page.get("Contents", [])}


def weights(uri: str) -> list[str]:
    return sorted(k for k in objects(uri) if k.endswith(".safetensors"))


def test_a_reference_holds_no_weights_and_resolves_to_the_same_files(
    s3_env, tiny_model_dir, tmp_path
):
    cfg = _cfg({"enabled": False})
    uri = run_uri(cfg, "r", 0, "checkpoint")
    ref = checkpoints.publish(cfg, tiny_model_dir, uri, tmp_path / "trained")
    # the artifact KFP's launcher moves: one small JSON file
    assert [p.name for p in (tmp_path / "trained").iterdir()] == [checkpoints.REF_FILE]
    assert (tmp_path / "trained" / checkpoints.REF_FILE).stat().st_size < 4096
    stored = sum(p.stat().st_size for p in tiny_model_dir.rglob("*") if p.is_file())
    assert ref.uri == uri and ref.bytes == stored
    assert checkpoints.read(tmp_path / "trained") == ref
    with checkpoints.local(tmp_path / "trained", cfg) as local:
        assert storage.scan_dir(local) == storage.scan_dir(tiny_model_dir)
    assert not Path(local).exists()  # the download is gone with the step
    # a plain folder (kfp.local, the in-process loop) and an unneeded checkpoint pass through
    with checkpoints.local(tiny_model_dir, cfg) as same, checkpoints.local(None, cfg) as none:
        assert (same, none) == (str(tiny_model_dir), None)


def test_a_retried_producer_stores_nothing_twice(s3_env, tiny_model_dir, tmp_path):
    cfg = _cfg({"enabled": False})
    uri = run_uri(cfg, "r", 0, "checkpoint")
    first = checkpoints.publish(cfg, tiny_model_dir, uri, tmp_path / "a")
    before = objects(uri)
    assert checkpoints.publish(cfg, tiny_model_dir, uri, tmp_path / "b") == first
    assert objects(uri) == before
    # other weights at the same place: refused (a version may point at it)
    other = tmp_path / "other"
    other.mkdir()
    (other / "model.safetensors").write_bytes(b"other")
    with pytest.raises(storage.AlreadyStoredError):
        checkpoints.publish(cfg, other, uri, tmp_path / "c")
    # the initial model: content-addressed, so a rerun (or a cached step) finds the same files
    with checkpoints.produce(cfg, None, tmp_path / "m1") as out:
        storage.download_dir(uri, out)
    again = checkpoints.publish(cfg, tiny_model_dir, None, tmp_path / "m2")
    assert checkpoints.read(tmp_path / "m1") == again
    assert again.uri.startswith(f"{cfg.storage.root}/models/")
    # tracking off: register verifies the stored checkpoint, uploads nothing
    done = tasks.register(cfg, "", "r", 0, str(tmp_path / "a"), EVALS)
    assert done.checkpoint_uri == uri and objects(uri) == before


def test_register_stages_the_mlflow_model_beside_the_stored_weights(
    s3_env, tiny_model_dir, tmp_path, mlflow_db
):
    """No artifact destination (a sqlite store): the registry's location is the producer's,
    `<root>/<run>/<i>/checkpoint`, and the weights are neither downloaded nor uploaded again."""
    cfg = _cfg({"tracking_uri": mlflow_db, "experiment": "ckpt"})
    uri = run_uri(cfg, "r", 0, "checkpoint")
    checkpoints.publish(cfg, tiny_model_dir, uri, tmp_path / "trained")
    weights_before = {k: v for k, v in objects(uri).items() if k.endswith(".safetensors")}
    parent = PipelineRun.start(cfg.tracking, "r").run_id
    done = tasks.register(cfg, parent, "r", 0, str(tmp_path / "trained"), EVALS)
    again = tasks.register(cfg, parent, "r", 0, str(tmp_path / "trained"), EVALS)  # a retry
    assert again == done and done.checkpoint_uri == uri
    client = connect(cfg.tracking)
    versions = client.search_model_versions(f"name = '{cfg.registered_model}'")
    assert [v.tags[CHECKPOINT_TAG] for v in versions] == [uri]
    # the same MLflow model an upload from a local folder gives, weights stored once
    staged = stage_mlflow_model(tiny_model_dir, tmp_path / "staged")
    expected = {p.relative_to(staged).as_posix() for p in staged.rglob("*") if p.is_file()}
    listed = {e.path for e in storage.verify(uri, deep=True)}
    assert listed == expected
    assert {k for k in objects(uri) if k != storage.MANIFEST} == expected
    assert {k: v for k, v in objects(uri).items() if k.endswith(".safetensors")} == weights_before


def test_register_copies_into_the_logged_model_then_drops_the_pipeline_copy(
    s3_env, mlflow_server, tiny_model_dir, tmp_path
):
    """The MLflow server's artifact destination is known: the version lives in its logged
    model's folder, copied there inside S3; the producer's copy goes once its consumers ran."""
    tracking = {
        "tracking_uri": mlflow_server.url,
        "experiment": f"ckpt-{uuid.uuid4().hex[:6]}",
        "artifacts_destination": "s3://sparring",
    }
    cfg = _cfg(tracking)
    run = "r-" + uuid.uuid4().hex[:6]
    parent = PipelineRun.start(cfg.tracking, run).run_id
    for i in (0, 1):
        checkpoints.publish(
            cfg, tiny_model_dir, run_uri(cfg, run, i, "checkpoint"), tmp_path / f"t{i}"
        )
    first = tasks.register(cfg, parent, run, 0, str(tmp_path / "t0"), EVALS)
    assert first.checkpoint_uri != run_uri(cfg, run, 0, "checkpoint")
    storage.verify(first.checkpoint_uri, deep=True)
    assert "MLmodel" in objects(first.checkpoint_uri)
    # iteration 0's producer copy stays while iteration 1's steps may read it
    assert weights(run_uri(cfg, run, 0, "checkpoint"))
    second = tasks.register(cfg, parent, run, 1, str(tmp_path / "t1"), EVALS)
    assert tasks.register(cfg, parent, run, 1, str(tmp_path / "t1"), EVALS) == second  # retry
    assert objects(run_uri(cfg, run, 0, "checkpoint")) == {}  # dropped by register 1
    assert weights(run_uri(cfg, run, 1, "checkpoint"))  # the last: dropped by `finish`
    client = connect(cfg.tracking)
    assert tasks.drop_pipeline_copies(cfg, client, run, [0, 1, 2]) == [
        run_uri(cfg, run, 1, "checkpoint")
    ]
    for done in (first, second):  # the registered copies stay whole
        storage.verify(done.checkpoint_uri, deep=True)
    versions = client.search_model_versions(f"name = '{cfg.registered_model}'")
    assert sorted(v.version for v in versions) == ["1", "2"]
