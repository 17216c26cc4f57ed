"""The local SeaweedFS S3 server: real process, real auth, clean stop."""

from __future__ import annotations

import socket
import tempfile
from pathlib import Path

import pytest
from botocore.exceptions import ClientError

from sparring.dev.s3server import S3Server


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_session_server_serves_and_checks_credentials(s3_server):
    env = s3_server.env()
    assert env["AWS_ENDPOINT_URL"] == env["AWS_ENDPOINT_URL_S3"] == s3_server.endpoint_url
    assert s3_server.secret_key not in repr(s3_server)
    client = s3_server.client()
    client.put_object(Bucket="sparring", Key="hello.txt", Body=b"hi")
    assert client.get_object(Bucket="sparring", Key="hello.txt")["Body"].read() == b"hi"

    s3_server.secret_key, real = "wrong", s3_server.secret_key
    try:
        with pytest.raises(ClientError, match="SignatureDoesNotMatch|403|AccessDenied"):
            s3_server.client().list_objects_v2(Bucket="sparring")
    finally:
        s3_server.secret_key = real


def test_start_creates_buckets_and_stop_cleans_up():
    with S3Server(buckets=["abc", "checkpoints"]) as server:
        data_dir, port = server.data_dir, server.port
        names = {b["Name"] for b in server.client().list_buckets()["Buckets"]}
        assert {"abc", "checkpoints"} <= names
        assert listening(port)
    assert not listening(port)
    assert not data_dir.exists()
    assert not list(Path(tempfile.gettempdir()).glob(f"seaweedfs-*-{port}.sock"))
