"""`helm test` check: the MLflow server answers /health and the S3 bucket is readable and writable.

Environment: MLFLOW_URL, S3_BUCKET, S3_PREFIX, plus the standard AWS variables
(AWS_ENDPOINT_URL_S3 for a non-AWS endpoint). Exits non-zero with a message naming what failed.
"""

from __future__ import annotations

import os
import sys
import time
import urllib.request
import uuid


def check_mlflow(url: str, attempts: int = 10, delay: float = 3.0) -> str:
    """GET <url>/health until it answers OK (the server may still be starting)."""
    last: Exception | None = None
    for _ in range(attempts):
        try:
            req = urllib.request.Request(f"{url.rstrip('/')}/health")
            with urllib.request.urlopen(req, timeout=5) as resp:
                body = resp.read().decode().strip()
                if resp.status == 200:
                    return body
        except Exception as e:  # noqa: BLE001 - report the last error below
            last = e
        time.sleep(delay)
    raise SystemExit(f"FAIL: MLflow at {url} did not answer /health: {last}")


def check_s3(bucket: str, prefix: str) -> str:
    """Write, read back and delete one object under the prefix."""
    import boto3

    s3 = boto3.session.Session().client("s3")  # fresh: reads the environment now
    key = f"{prefix.strip('/')}/.helm-test/{uuid.uuid4().hex}"
    try:
        s3.put_object(Bucket=bucket, Key=key, Body=b"sparring")
        body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        s3.delete_object(Bucket=bucket, Key=key)
    except Exception as e:  # noqa: BLE001 - the message is what the user needs
        raise SystemExit(f"FAIL: S3 bucket {bucket!r} not writable at {key!r}: {e}") from e
    if body != b"sparring":
        raise SystemExit(f"FAIL: S3 read back {body!r} from s3://{bucket}/{key}")
    return f"s3://{bucket}/{key}"


def main() -> int:
    print("mlflow:", check_mlflow(os.environ["MLFLOW_URL"]))
    print("s3: wrote and read", check_s3(os.environ["S3_BUCKET"], os.environ.get("S3_PREFIX", "")))
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
