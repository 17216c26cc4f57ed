"""Storage against a real SeaweedFS server and the local filesystem; mocks only inject faults."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from unittest import mock

import pytest

from sparring.dev.s3server import free_ports
from sparring.storage import (
    MANIFEST,
    BucketNotFoundError,
    S3AuthError,
    S3UnreachableError,
    StorageConfig,
    VerifyError,
    _LocalStore,
    _S3Store,
    artifact_uri,
    download_dir,
    upload_dir,
    verify,
)


def make_checkpoint(root: Path) -> Path:
    """A small fake checkpoint: 4 files, one in a subfolder."""
    root.mkdir(parents=True)
    (root / "config.json").write_text('{"hidden_size": 32}')
    (root / "model.safetensors").write_bytes(bytes(range(256)) * 40)
    (root / "tokenizer.json").write_text('{"vocab": {}}')
    (root / "extra").mkdir()
    (root / "extra" / "generation_config.json").write_text("{}")
    return root


def s3_config(server, **changes) -> StorageConfig:
    fields = {
        "endpoint_url": server.endpoint_url,
        "access_key_id": server.access_key,
        "secret_access_key": server.secret_key,
    }
    return StorageConfig(**{**fields, **changes})


def fresh_uri(server_or_dir) -> str:
    run = uuid.uuid4().hex[:8]
    if isinstance(server_or_dir, Path):
        return artifact_uri(server_or_dir.as_uri(), run, 0, "checkpoint")
    return artifact_uri("s3://sparring/test", run, 0, "checkpoint")


@pytest.fixture(params=["s3", "file"])
def target(request, s3_server, tmp_path):
    """(uri, config) for a fresh destination on S3 or on the local filesystem."""
    if request.param == "s3":
        return fresh_uri(s3_server), s3_config(s3_server)
    return fresh_uri(tmp_path / "store"), None


def test_roundtrip(target, tmp_path):
    uri, config = target
    ckpt = make_checkpoint(tmp_path / "ckpt")
    entries = upload_dir(ckpt, uri, config)
    assert [e.path for e in entries] == [
        "config.json",
        "extra/generation_config.json",
        "model.safetensors",
        "tokenizer.json",
    ]
    assert verify(uri, config, deep=True) == entries
    out = download_dir(uri, tmp_path / "down", config)
    for e in entries:
        assert (out / e.path).read_bytes() == (ckpt / e.path).read_bytes()


def test_env_config(s3_server, monkeypatch, tmp_path):
    for key, value in s3_server.env().items():
        monkeypatch.setenv(key, value)
    uri = fresh_uri(s3_server)
    upload_dir(make_checkpoint(tmp_path / "ckpt"), uri)  # no config: the AWS variables
    assert StorageConfig.from_env().endpoint_url == s3_server.endpoint_url
    verify(uri)


def recording_put(real_put, calls: list[str], fail_at: int | None = None):
    """A store `put` that records each file and raises on the `fail_at`-th one (the fault)."""

    def put(self, local, entry):
        calls.append(entry.path)
        if len(calls) == fail_at:
            raise ConnectionError("injected: connection reset during upload")
        real_put(self, local, entry)

    return put


def test_interrupted_upload_is_not_complete_and_rerun_finishes(target, tmp_path):
    uri, config = target
    ckpt = make_checkpoint(tmp_path / "ckpt")
    store_cls = _S3Store if config else _LocalStore
    calls: list[str] = []
    with (
        mock.patch.object(store_cls, "put", recording_put(store_cls.put, calls, fail_at=3)),
        pytest.raises(ConnectionError),
    ):
        upload_dir(ckpt, uri, config)
    with pytest.raises(VerifyError, match="no MANIFEST.json"):
        verify(uri, config)

    calls.clear()
    with mock.patch.object(store_cls, "put", recording_put(store_cls.put, calls)):
        upload_dir(ckpt, uri, config)
    assert calls == ["model.safetensors", "tokenizer.json"]  # the first two were kept
    verify(uri, config, deep=True)


def test_reupload_hides_the_old_manifest_until_done(s3_server, tmp_path):
    uri, config = fresh_uri(s3_server), s3_config(s3_server)
    ckpt = make_checkpoint(tmp_path / "ckpt")
    upload_dir(ckpt, uri, config)
    (ckpt / "model.safetensors").write_bytes(b"new weights")
    with (
        mock.patch.object(_S3Store, "put", side_effect=ConnectionError("injected")),
        pytest.raises(ConnectionError),
    ):
        upload_dir(ckpt, uri, config)
    with pytest.raises(VerifyError, match="incomplete"):
        verify(uri, config)


def test_corrupt_object_fails_verify_and_download(s3_server, tmp_path):
    uri, config = fresh_uri(s3_server), s3_config(s3_server)
    upload_dir(make_checkpoint(tmp_path / "ckpt"), uri, config)
    client, key = s3_server.client(), uri.removeprefix("s3://sparring/") + "/model.safetensors"
    size = (tmp_path / "ckpt" / "model.safetensors").stat().st_size

    client.put_object(Bucket="sparring", Key=key, Body=b"\0" * size)  # same size, other bytes
    verify(uri, config)  # sizes alone can't see it
    with pytest.raises(VerifyError, match="model.safetensors: sha256 differs"):
        verify(uri, config, deep=True)
    with pytest.raises(VerifyError, match="corrupt"):
        download_dir(uri, tmp_path / "down", config)

    client.put_object(Bucket="sparring", Key=key, Body=b"truncated")
    with pytest.raises(VerifyError, match="model.safetensors: 9 bytes, expected 10240"):
        verify(uri, config)


def test_unreachable_endpoint_fails_fast(tmp_path):
    (port,) = free_ports(1)
    config = StorageConfig(
        endpoint_url=f"http://127.0.0.1:{port}", access_key_id="a", secret_access_key="b"
    )
    start = time.monotonic()
    with pytest.raises(S3UnreachableError, match=f"127.0.0.1:{port}.*AWS_ENDPOINT_URL"):
        upload_dir(make_checkpoint(tmp_path / "ckpt"), "s3://sparring/x", config)
    assert time.monotonic() - start < 10


def test_wrong_credentials(s3_server, tmp_path):
    config = s3_config(s3_server, secret_access_key="not-the-secret")
    with pytest.raises(S3AuthError, match="rejected access key") as err:
        verify(fresh_uri(s3_server), config)
    assert "not-the-secret" not in str(err.value)


def test_missing_bucket(s3_server):
    with pytest.raises(BucketNotFoundError, match="'no-such-bucket'.*create it"):
        verify("s3://no-such-bucket/x", s3_config(s3_server))


def test_secrets_are_masked(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "very-secret")
    config = StorageConfig.from_env()
    assert "very-secret" not in repr(config) and "very-secret" not in str(config.model_dump())
    assert config.secret_access_key.get_secret_value() == "very-secret"


def test_missing_manifest_on_local_path(tmp_path):
    with pytest.raises(VerifyError, match=MANIFEST):
        verify(str(tmp_path))


def test_multipart_upload(s3_server, tmp_path):
    ckpt = make_checkpoint(tmp_path / "ckpt")
    (ckpt / "model.safetensors").write_bytes(bytes(range(256)) * (6 << 12))  # 6 MiB: 2 parts
    uri, config = fresh_uri(s3_server), s3_config(s3_server, multipart_chunk_mb=5)
    upload_dir(ckpt, uri, config)
    verify(uri, config, deep=True)
