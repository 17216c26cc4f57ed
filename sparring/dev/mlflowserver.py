"""A local MLflow tracking server run the way the Helm chart runs it: `mlflow server
--serve-artifacts`, so clients reach artifacts through its `mlflow-artifacts:` proxy and need
only `MLFLOW_TRACKING_URI`. For tests and the embedded default of `sparring run`.

    with MlflowServer(workdir, "s3://sparring", env=s3.env()) as server:
        os.environ["MLFLOW_TRACKING_URI"] = server.url
        mlflow.transformers.load_model("models:/sparring-matching@champion")

The registry and runs live in `<workdir>/mlflow.db` (sqlite); `mlflow-artifacts:/<path>` is
`<destination>/<path>`, and run/model artifacts go under `mlflow-artifacts:/mlflow`. The
server binds 127.0.0.1 on a free port; `stop()` ends its whole process group (uvicorn workers).

With `admin=(user, password)` it runs MLflow's basic-auth app (`--app-name basic-auth`, as the
chart's `mlflow.auth.enabled`; needs Flask-WTF): users in `<workdir>/basic_auth.db`, `admin`
created on first start, every request but `/health` needs a login, which clients give with
`MLFLOW_TRACKING_USERNAME` / `MLFLOW_TRACKING_PASSWORD`.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

import requests

from sparring.dev.process import LocalServer, terminate
from sparring.dev.s3server import free_ports

ARTIFACT_ROOT = "mlflow-artifacts:/mlflow"  # run and logged-model artifacts, under destination


class MlflowServerError(RuntimeError):
    """The local MLflow server did not start."""


class MlflowServer(LocalServer):
    """`mlflow server` on sqlite with `--serve-artifacts` to `destination` (s3:// or a path).

    `env` adds to the server's environment, e.g. the S3 endpoint and credentials
    (`AWS_ENDPOINT_URL` is passed on as MLflow's `MLFLOW_S3_ENDPOINT_URL`).
    """

    def __init__(
        self,
        workdir: str | Path,
        destination: str,
        env: dict[str, str] | None = None,
        admin: tuple[str, str] | None = None,
    ) -> None:
        self.workdir = Path(workdir)
        self.destination = destination
        self.env = dict(env or {})
        self.admin = admin
        self.port = free_ports(1)[0]
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.workdir / "mlflow-server.log"

    def start(self, timeout: float = 90.0, tries: int = 3) -> MlflowServer:
        """Start the server and wait until `/health` answers. A port taken between choosing
        it and binding it (another process's race) is retried on a fresh port."""
        for attempt in range(tries):
            try:
                return self._start(timeout)
            except MlflowServerError as e:
                if "address already in use" not in str(e) or attempt == tries - 1:
                    raise
                self.port = free_ports(1)[0]
        raise AssertionError("unreachable")

    def _start(self, timeout: float) -> MlflowServer:
        self.workdir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **self.env, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        if endpoint := env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL"):
            env["MLFLOW_S3_ENDPOINT_URL"] = endpoint
        cmd = [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1"]
        cmd += ["--port", str(self.port), "--workers", "1"]
        cmd += ["--backend-store-uri", f"sqlite:///{self.workdir / 'mlflow.db'}"]
        cmd += ["--serve-artifacts", "--artifacts-destination", self.destination]
        cmd += ["--default-artifact-root", ARTIFACT_ROOT]
        if self.admin:
            cmd += ["--app-name", "basic-auth"]
            env |= self._auth_env()
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + timeout
        while True:
            try:
                if requests.get(f"{self.url}/health", timeout=1).ok:
                    return self
            except requests.RequestException:  # not listening yet
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                tail = self.log_path.read_text(errors="replace")[-2000:]
                raise MlflowServerError(f"mlflow server did not start; its log ends:\n{tail}")
            time.sleep(0.2)

    def _auth_env(self) -> dict[str, str]:
        """The basic-auth app's settings: its config file (users database in `workdir`), the
        admin it creates on first start, and the key its CSRF protection signs with."""
        assert self.admin is not None
        ini = self.workdir / "basic_auth.ini"
        ini.write_text(
            "[mlflow]\ndefault_permission = READ\nauth_cache_ttl_seconds = 300\n"
            f"database_uri = sqlite:///{self.workdir / 'basic_auth.db'}\n"
            "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
        )
        return {
            "MLFLOW_AUTH_CONFIG_PATH": str(ini),
            "MLFLOW_AUTH_ADMIN_USERNAME": self.admin[0],
            "MLFLOW_AUTH_ADMIN_PASSWORD": self.admin[1],
            "MLFLOW_FLASK_SERVER_SECRET_KEY": secrets.token_hex(16),
        }

    def stop(self, grace: float = 15.0) -> None:
        """SIGTERM the server's process group, then SIGKILL after `grace` seconds."""
        if self.proc is not None:
            terminate(self.proc, grace, group=True)
