"""`helm test` check: the MLflow server answers /health, the S3 bucket is readable and
writable, the KFP API answers, and the runner ServiceAccount (this pod's) gets its S3
credentials: it can read the S3 Secret through the Kubernetes API as Argo's executor would, or,
with IRSA, the EKS webhook gave it the expected role.

Environment: MLFLOW_URL, S3_BUCKET, S3_PREFIX, KFP_HOST, POD_NAMESPACE, RUNNER_S3_SECRET (empty
with IRSA), RUNNER_S3_SECRET_KEYS, RUNNER_ROLE_ARN, plus the standard AWS variables
(AWS_ENDPOINT_URL_S3 for a non-AWS endpoint). Exits non-zero with a message naming what failed.
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


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


def check_kfp(host: str, timeout: float = 10.0) -> str:
    """GET <host>/apis/v2beta1/healthz: the KFP API server answers; returns its version."""
    try:
        with urllib.request.urlopen(
            f"{host.rstrip('/')}/apis/v2beta1/healthz", timeout=timeout
        ) as r:
            body = json.loads(r.read().decode())
    except Exception as e:  # noqa: BLE001 - the message is what the user needs
        raise SystemExit(
            f"FAIL: KFP API at {host} did not answer /apis/v2beta1/healthz: {e}"
        ) from e
    return f"KFP {body.get('tag_name', '?')} multi_user={body.get('multi_user')}"


def check_runner_secret(
    namespace: str, secret: str, keys: list[str], api: str | None = None, sa_dir: Path = SA_DIR
) -> str:
    """Read Secret `secret` with this pod's ServiceAccount token, as a pipeline pod of the runner
    account would (its token is mounted), and check it holds `keys`."""
    if api is None:
        api = f"https://{os.environ['KUBERNETES_SERVICE_HOST']}:{os.environ['KUBERNETES_SERVICE_PORT']}"
    token_file = sa_dir / "token"
    if not token_file.exists():
        raise SystemExit(f"FAIL: no ServiceAccount token at {token_file}: the runner needs one")
    req = urllib.request.Request(f"{api}/api/v1/namespaces/{namespace}/secrets/{secret}")
    req.add_header("Authorization", f"Bearer {token_file.read_text().strip()}")
    ca = sa_dir / "ca.crt"
    ctx = ssl.create_default_context(cafile=str(ca)) if ca.exists() else None
    try:
        with urllib.request.urlopen(req, timeout=10, context=ctx) as r:
            data = json.loads(r.read().decode()).get("data") or {}
    except urllib.error.HTTPError as e:
        raise SystemExit(
            f"FAIL: the runner ServiceAccount cannot read Secret {namespace}/{secret}: HTTP "
            f"{e.code} (rbac.create, or grant get on secrets)"
        ) from e
    missing = [k for k in keys if not base64.b64decode(data.get(k, "")).strip()]
    if missing:
        raise SystemExit(f"FAIL: Secret {namespace}/{secret} has no value for {missing}")
    return f"{namespace}/{secret} ({', '.join(keys)})"


def check_runner_irsa(role_arn: str, env=os.environ) -> str:
    """IRSA: the EKS pod identity webhook injected the role of the runner's annotation."""
    got = env.get("AWS_ROLE_ARN", "")
    token = env.get("AWS_WEB_IDENTITY_TOKEN_FILE", "")
    if got != role_arn or not token or not Path(token).exists():
        raise SystemExit(
            f"FAIL: the runner ServiceAccount has no IRSA credentials (AWS_ROLE_ARN={got!r}, "
            f"want {role_arn!r}; token file {token!r}): check the eks.amazonaws.com/role-arn "
            "annotation and the pod identity webhook"
        )
    return f"IRSA role {role_arn}"


def main() -> int:
    env = os.environ
    print("mlflow:", check_mlflow(env["MLFLOW_URL"]))
    print("s3: wrote and read", check_s3(env["S3_BUCKET"], env.get("S3_PREFIX", "")))
    print("kfp:", check_kfp(env["KFP_HOST"]))
    if env.get("RUNNER_S3_SECRET"):
        keys = env.get("RUNNER_S3_SECRET_KEYS", "AWS_ACCESS_KEY_ID,AWS_SECRET_ACCESS_KEY")
        found = check_runner_secret(env["POD_NAMESPACE"], env["RUNNER_S3_SECRET"], keys.split(","))
        print("runner: reads", found)
    elif env.get("RUNNER_ROLE_ARN"):
        print("runner:", check_runner_irsa(env["RUNNER_ROLE_ARN"]))
    else:
        print("runner: credentials from workload identity; not checked here")
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
