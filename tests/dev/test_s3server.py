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


def test_a_port_taken_before_weed_binds_it_is_retried_on_fresh_ports(monkeypatch):
    """Another process binds a chosen port first (the race `free_ports` can't exclude): weed
    reports the clash, and the server starts again on fresh ports instead of failing."""
    from sparring.dev import s3server

    real = s3server.free_ports
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        calls = []

        def first_with_the_taken_port(n: int, grpc_offset_free: bool = False) -> list[int]:
            ports = real(n, grpc_offset_free)
            calls.append(ports)
            return [taken, *ports[1:]] if len(calls) == 1 else ports

        monkeypatch.setattr(s3server, "free_ports", first_with_the_taken_port)
        with S3Server(buckets=["abc"]) as server:
            assert len(calls) == 2 and server.port not in (taken, 0)
            assert {b["Name"] for b in server.client().list_buckets()["Buckets"]} == {"abc"}
