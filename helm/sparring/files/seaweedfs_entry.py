"""Entry point of the bundled dev S3 server: `weed mini` plus the bucket the chart needs.

Starts SeaweedFS's all-in-one server with an identities file built from the S3 credentials
(AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY), waits until the S3 API answers, creates
$S3_BUCKET if missing, then stays in the foreground and forwards SIGTERM to weed.

Environment: S3_BUCKET, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, DATA_DIR (default /data),
S3_PORT (default 8333), BIND_IP (default 0.0.0.0), READY_TIMEOUT (seconds, default 60).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path


def identities(access_key: str, secret_key: str) -> dict:
    """A SeaweedFS S3 identities config with one admin identity."""
    return {
        "identities": [
            {
                "name": "sparring",
                "credentials": [{"accessKey": access_key, "secretKey": secret_key}],
                "actions": ["Admin", "Read", "List", "Tagging", "Write"],
            }
        ]
    }


def command(weed: str, data_dir: Path, config: Path, port: int, bind_ip: str) -> list[str]:
    """The `weed mini` command line (S3 on `port`; the web UIs and extra gateways off)."""
    return [
        weed,
        f"-logdir={data_dir / 'logs'}",
        "mini",
        f"-dir={data_dir / 'data'}",
        "-ip=127.0.0.1",
        f"-ip.bind={bind_ip}",
        "-admin.ui=false",
        "-webdav=false",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        f"-s3.config={config}",
        f"-s3.port={port}",
    ]


def ensure_bucket(endpoint: str, bucket: str, timeout: float) -> None:
    """Wait for the S3 API, then create `bucket` unless it exists."""
    import boto3
    from botocore.config import Config

    s3 = boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name=os.environ.get("AWS_DEFAULT_REGION", "us-east-1"),
        config=Config(connect_timeout=2, retries={"max_attempts": 1}),
    )
    deadline = time.monotonic() + timeout
    while True:
        try:
            names = {b["Name"] for b in s3.list_buckets().get("Buckets", [])}
            break
        except Exception as e:  # noqa: BLE001 - not up yet
            if time.monotonic() > deadline:
                raise SystemExit(f"S3 API at {endpoint} not ready after {timeout:.0f}s: {e}") from e
            time.sleep(0.5)
    if bucket not in names:
        s3.create_bucket(Bucket=bucket)
    print(f"bucket {bucket!r} ready at {endpoint}", flush=True)


def main(env: dict[str, str] | None = None) -> int:
    env = dict(os.environ if env is None else env)
    data_dir = Path(env.get("DATA_DIR", "/data"))
    (data_dir / "logs").mkdir(parents=True, exist_ok=True)
    (data_dir / "data").mkdir(parents=True, exist_ok=True)
    config = data_dir / "identities.json"
    config.write_text(
        json.dumps(identities(env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"]))
    )
    config.chmod(0o600)
    port = int(env.get("S3_PORT", "8333"))
    weed = shutil.which("weed") or str(Path(sys.executable).parent / "weed")
    # weed logs to stderr so that stdout carries only this script's own status lines
    proc = subprocess.Popen(
        command(weed, data_dir, config, port, env.get("BIND_IP", "0.0.0.0")), stdout=sys.stderr
    )
    signal.signal(signal.SIGTERM, lambda *_: proc.terminate())
    try:
        ensure_bucket(
            f"http://127.0.0.1:{port}", env["S3_BUCKET"], float(env.get("READY_TIMEOUT", "60"))
        )
    except BaseException:
        proc.terminate()
        proc.wait(timeout=10)
        raise
    return proc.wait()


if __name__ == "__main__":
    sys.exit(main())
