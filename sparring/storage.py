"""Artifact storage: directories (checkpoints, datasets) under `s3://bucket/prefix` or local paths.

Layout: `s3://<bucket>/<prefix>/<run>/<iteration>/<name>/...` (see `artifact_uri`). Every
uploaded directory ends with a `MANIFEST.json` (relative path, size and sha256 of each file),
written LAST: a directory without a manifest is an interrupted upload, never a checkpoint.

    upload_dir("out/ckpt", "s3://sparring/runs/r1/0/checkpoint")   # resumable; manifest last
    verify("s3://sparring/runs/r1/0/checkpoint", deep=True)        # sizes (+ sha256 if deep)
    download_dir("s3://sparring/runs/r1/0/checkpoint", "/tmp/ckpt")  # verified locally
    copy_dir("s3://…/r1/0/checkpoint", "s3://…/mlflow/…/artifacts")  # server-side CopyObject
    add_files("staged/", "s3://…/r1/0/checkpoint")  # more files into a complete upload
    delete_dir("s3://sparring/runs/r1/0/checkpoint")               # manifest first

S3 settings come from the standard AWS variables (`AWS_ENDPOINT_URL_S3` / `AWS_ENDPOINT_URL`,
`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_DEFAULT_REGION`) or an
explicit `StorageConfig`. Failures raise `StorageError` subclasses whose message names the
endpoint and the fix; secrets never appear in messages or reprs.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol
from urllib.parse import urlparse

import boto3
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError
from pydantic import BaseModel, Field, SecretStr

MANIFEST = "MANIFEST.json"
_CHUNK = 1 << 20
_PARALLEL_FILES = 4  # files `download_dir` fetches at once, each in `max_concurrency` parts


# -- errors ------------------------------------------------------------------------------------


class StorageError(RuntimeError):
    """Base class: a storage operation failed; the message says why and how to fix it."""


class S3UnreachableError(StorageError):
    """The S3 endpoint does not answer."""


class S3AuthError(StorageError):
    """The S3 endpoint rejected the credentials (or they are missing)."""


class BucketNotFoundError(StorageError):
    """The bucket does not exist."""


class VerifyError(StorageError):
    """A stored directory is incomplete or corrupt (missing manifest, missing/changed files)."""


class AlreadyStoredError(StorageError):
    """A write-once prefix already holds a complete directory with other contents."""


# -- config ------------------------------------------------------------------------------------


class StorageConfig(BaseModel):
    """How to reach S3. Build it with `StorageConfig.from_env()` to read the AWS variables."""

    endpoint_url: str | None = None  # e.g. http://127.0.0.1:8333; None = AWS itself
    region: str = "us-east-1"
    access_key_id: str | None = None  # None = boto3's default chain (env, profile, IAM role)
    secret_access_key: SecretStr | None = None  # masked in repr and logs
    session_token: SecretStr | None = None  # for temporary credentials; masked
    connect_timeout: float = Field(2.0, gt=0)  # seconds; short so a dead endpoint fails fast
    read_timeout: float = Field(60.0, gt=0)  # seconds per request
    max_attempts: int = Field(2, ge=1)  # total tries per request (botocore "standard" retries)
    multipart_chunk_mb: int = Field(64, ge=5)  # multipart threshold and part size for uploads
    max_concurrency: int = Field(4, ge=1)  # parallel parts per transfer

    @classmethod
    def from_env(cls, **overrides: object) -> StorageConfig:
        """Read `AWS_ENDPOINT_URL_S3` (or `AWS_ENDPOINT_URL`), keys and region from the env."""
        env = os.environ
        values = {
            "endpoint_url": env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL"),
            "region": env.get("AWS_DEFAULT_REGION") or env.get("AWS_REGION") or "us-east-1",
            "access_key_id": env.get("AWS_ACCESS_KEY_ID"),
            "secret_access_key": env.get("AWS_SECRET_ACCESS_KEY"),
            "session_token": env.get("AWS_SESSION_TOKEN"),
        }
        return cls(**{**values, **overrides})

    def client(self):  # -> S3Client
        """A boto3 S3 client with short connect timeouts and few retries."""
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            region_name=self.region,
            aws_access_key_id=self.access_key_id,
            aws_secret_access_key=_reveal(self.secret_access_key),
            aws_session_token=_reveal(self.session_token),
            config=Config(
                connect_timeout=self.connect_timeout,
                read_timeout=self.read_timeout,
                retries={"max_attempts": self.max_attempts, "mode": "standard"},
                s3={"addressing_style": "path" if self.endpoint_url else "auto"},
                # boto3 >= 1.36 sends CRC32 checksums by default; many non-AWS servers reject them
                request_checksum_calculation="when_required",
                response_checksum_validation="when_required",
                max_pool_connections=max(10, _PARALLEL_FILES * self.max_concurrency),
            ),
        )


def _reveal(secret: SecretStr | None) -> str | None:
    return secret.get_secret_value() if secret else None


# -- manifest ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class FileEntry:
    """One file of a stored directory: path relative to its root (POSIX), bytes, sha256 hex."""

    path: str
    size: int
    sha256: str


def sha256_stream(stream: BinaryIO) -> str:
    """sha256 hex digest of a binary stream, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    while chunk := stream.read(_CHUNK):
        digest.update(chunk)
    return digest.hexdigest()


def scan_dir(local_dir: str | Path) -> list[FileEntry]:
    """Entries for every file under `local_dir` (sorted; any old MANIFEST.json left out)."""
    root = Path(local_dir)
    if not root.is_dir():
        raise StorageError(f"{root} is not a directory: pass the checkpoint or dataset folder.")
    entries = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = path.relative_to(root).as_posix()
        if rel != MANIFEST:
            with path.open("rb") as f:
                entries.append(FileEntry(rel, path.stat().st_size, sha256_stream(f)))
    return entries


# -- stores: the few primitives the directory operations need ------------------------------------


class _Store(Protocol):
    """Files under one root URI."""

    uri: str

    def sizes(self) -> dict[str, int]: ...  # relative path -> size, every object under the root
    def stored_sha256(self, rel: str) -> str | None: ...  # cheap: recorded at upload time
    def open(self, rel: str) -> BinaryIO: ...
    def put(self, local: Path, entry: FileEntry) -> None: ...
    def get(self, rel: str, local: Path) -> None: ...
    def read_text(self, rel: str) -> str | None: ...  # None if absent
    def write_text(self, rel: str, text: str) -> None: ...
    def delete(self, rel: str) -> None: ...
    def copy(self, source: _Store, entry: FileEntry) -> None: ...  # same kind of store


class _LocalStore:
    """A folder on the local filesystem (`file:///abs/path` or a plain path)."""

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self.root = Path(urlparse(uri).path if uri.startswith("file://") else uri)

    def sizes(self) -> dict[str, int]:
        if not self.root.is_dir():
            return {}
        return {
            p.relative_to(self.root).as_posix(): p.stat().st_size
            for p in self.root.rglob("*")
            if p.is_file()
        }

    def stored_sha256(self, rel: str) -> str | None:
        with self.open(rel) as f:
            return sha256_stream(f)

    def open(self, rel: str) -> BinaryIO:
        return (self.root / rel).open("rb")

    def put(self, local: Path, entry: FileEntry) -> None:
        target = self.root / entry.path
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(target.name + ".partial")
        shutil.copyfile(local, partial)
        partial.replace(target)  # atomic: a crash never leaves a short file under the real name

    def get(self, rel: str, local: Path) -> None:
        shutil.copyfile(self.root / rel, local)

    def read_text(self, rel: str) -> str | None:
        path = self.root / rel
        return path.read_text() if path.is_file() else None

    def write_text(self, rel: str, text: str) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        partial = self.root / (rel + ".partial")
        partial.write_text(text)
        partial.replace(self.root / rel)

    def delete(self, rel: str) -> None:
        (self.root / rel).unlink(missing_ok=True)

    def copy(self, source: _Store, entry: FileEntry) -> None:
        if not isinstance(source, _LocalStore):
            raise StorageError(f"copy {source.uri} -> {self.uri}: copy within one kind of store")
        self.put(source.root / entry.path, entry)


class _S3Store:
    """Objects under `s3://bucket/prefix/`; checks the bucket (and so endpoint and keys) on open."""

    def __init__(self, uri: str, config: StorageConfig) -> None:
        parsed = urlparse(uri)
        self.uri, self.bucket, self.prefix = uri, parsed.netloc, parsed.path.strip("/")
        self.config = config
        self.client = config.client()
        self.transfer = TransferConfig(
            multipart_threshold=config.multipart_chunk_mb << 20,
            multipart_chunksize=config.multipart_chunk_mb << 20,
            max_concurrency=config.max_concurrency,
        )
        with self._errors():
            self.client.head_bucket(Bucket=self.bucket)

    def _key(self, rel: str) -> str:
        return f"{self.prefix}/{rel}" if self.prefix else rel

    @contextmanager
    def _errors(self) -> Iterator[None]:
        """Turn botocore failures into StorageErrors that name the endpoint and the fix."""
        where = f"S3 endpoint {self.config.endpoint_url or 'AWS default'} (bucket {self.bucket!r})"
        try:
            yield
        except NoCredentialsError as e:
            raise S3AuthError(
                f"No S3 credentials for {where}: set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY "
                "or StorageConfig.access_key_id/secret_access_key."
            ) from e
        except ClientError as e:
            code = str(e.response.get("Error", {}).get("Code", ""))
            if code in {"403", "AccessDenied", "SignatureDoesNotMatch", "InvalidAccessKeyId"}:
                raise S3AuthError(
                    f"{where} rejected access key {self.config.access_key_id!r} ({code}): check "
                    "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY (or the Secret mounted into the pod)."
                ) from e
            if code in {"404", "NoSuchBucket"}:
                raise BucketNotFoundError(
                    f"Bucket {self.bucket!r} does not exist at {where}: create it "
                    f"(`aws s3 mb s3://{self.bucket}`) or point the URI at an existing bucket."
                ) from e
            raise StorageError(f"{where} failed: {e}") from e
        except BotoCoreError as e:  # connection refused, DNS, timeouts
            raise S3UnreachableError(
                f"Cannot reach {where}: {e}. Start the S3 server or fix AWS_ENDPOINT_URL_S3 / "
                "AWS_ENDPOINT_URL / StorageConfig.endpoint_url."
            ) from e

    def sizes(self) -> dict[str, int]:
        base = self._key("")
        out: dict[str, int] = {}
        with self._errors():
            for page in self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=base
            ):
                for obj in page.get("Contents", []):
                    out[obj["Key"][len(base) :]] = obj["Size"]
        return out

    def stored_sha256(self, rel: str) -> str | None:
        with self._errors():
            head = self.client.head_object(Bucket=self.bucket, Key=self._key(rel))
        return head.get("Metadata", {}).get("sha256")

    def open(self, rel: str) -> BinaryIO:
        with self._errors():
            return self.client.get_object(Bucket=self.bucket, Key=self._key(rel))["Body"]

    def put(self, local: Path, entry: FileEntry) -> None:
        with self._errors():
            self.client.upload_file(
                str(local),
                self.bucket,
                self._key(entry.path),
                ExtraArgs={"Metadata": {"sha256": entry.sha256}},
                Config=self.transfer,
            )

    def get(self, rel: str, local: Path) -> None:
        with self._errors():
            self.client.download_file(self.bucket, self._key(rel), str(local), Config=self.transfer)

    def read_text(self, rel: str) -> str | None:
        with self._errors():
            try:
                body = self.client.get_object(Bucket=self.bucket, Key=self._key(rel))["Body"]
                return body.read().decode()
            except self.client.exceptions.NoSuchKey:
                return None

    def write_text(self, rel: str, text: str) -> None:
        with self._errors():
            self.client.put_object(Bucket=self.bucket, Key=self._key(rel), Body=text.encode())

    def delete(self, rel: str) -> None:
        with self._errors():
            self.client.delete_object(Bucket=self.bucket, Key=self._key(rel))

    def copy(self, source: _Store, entry: FileEntry) -> None:
        """Server-side (CopyObject, multipart past the chunk size): no byte passes through us."""
        if not isinstance(source, _S3Store) or source.config != self.config:
            raise StorageError(f"copy {source.uri} -> {self.uri}: copy within one S3 endpoint")
        with self._errors():
            self.client.copy(
                {"Bucket": source.bucket, "Key": source._key(entry.path)},
                self.bucket,
                self._key(entry.path),
                ExtraArgs={"Metadata": {"sha256": entry.sha256}},
                Config=self.transfer,
            )


def _open_store(uri: str, config: StorageConfig | None) -> _Store:
    scheme = urlparse(uri).scheme
    if scheme == "s3":
        return _S3Store(uri, config or StorageConfig.from_env())
    if scheme in ("", "file"):
        return _LocalStore(uri)
    raise StorageError(
        f"Unsupported storage URI {uri!r}: use s3://bucket/prefix, file:// or a path."
    )


# -- directory operations ----------------------------------------------------------------------


def artifact_uri(root: str, run: str, iteration: int, name: str) -> str:
    """`<root>/<run>/<iteration>/<name>`, e.g. `s3://sparring/runs/r1/0/checkpoint`."""
    return f"{root.rstrip('/')}/{run}/{iteration}/{name}"


def upload_dir(
    local_dir: str | Path,
    uri: str,
    config: StorageConfig | None = None,
    write_once: bool = False,
    entries: list[FileEntry] | None = None,
) -> list[FileEntry]:
    """Upload `local_dir` to `uri`, then write the manifest; returns the manifest's entries.

    Resumable: files already stored with the same size and sha256 are skipped, so rerunning an
    interrupted upload finishes it. Any old manifest is removed first, so until this returns the
    destination never looks complete. With `write_once` (checkpoints), a destination that
    already holds a complete manifest is left alone: the same files are a no-op (a retried
    task), other files raise AlreadyStoredError. `entries`: `scan_dir(local_dir)` if the caller
    already has it (every file is hashed once).
    """
    entries = entries if entries is not None else scan_dir(local_dir)
    store = _open_store(uri, config)
    if write_once and store.read_text(MANIFEST) is not None:
        if _manifest(store) == entries:
            return entries
        raise AlreadyStoredError(
            f"{uri} already holds a complete upload with other files: it is write-once (a "
            "registered model version may point at it). Upload to a new run or iteration."
        )
    store.delete(MANIFEST)
    for entry in _missing(store, entries):
        store.put(Path(local_dir) / entry.path, entry)
    store.write_text(MANIFEST, json.dumps({"files": [e.__dict__ for e in entries]}, indent=1))
    return entries


def read_text(uri: str, rel: str, config: StorageConfig | None = None) -> str | None:
    """The text of the file `rel` under `uri`; None if there is none."""
    return _open_store(uri, config).read_text(rel)


def _missing(store: _Store, entries: list[FileEntry]) -> list[FileEntry]:
    """The entries `store` does not already hold with their size and sha256 (what a retried
    upload or copy still has to write)."""
    present = store.sizes()
    return [
        e
        for e in entries
        if not (present.get(e.path) == e.size and store.stored_sha256(e.path) == e.sha256)
    ]


def _manifest(store: _Store) -> list[FileEntry]:
    text = store.read_text(MANIFEST)
    if text is None:
        raise VerifyError(
            f"{store.uri} has no {MANIFEST}: the upload is incomplete (rerun upload_dir to finish it) "
            "or this is not a Sparring artifact."
        )
    return [FileEntry(**e) for e in json.loads(text)["files"]]


def verify(uri: str, config: StorageConfig | None = None, deep: bool = False) -> list[FileEntry]:
    """Check that every file in the manifest is stored with its size (and sha256 if `deep`).

    `deep` re-reads every object, which for S3 means downloading it; sizes alone catch
    truncated and missing files. Returns the manifest's entries; raises VerifyError.
    """
    store = _open_store(uri, config)
    entries = _manifest(store)
    sizes = store.sizes()
    problems = [
        f"{e.path}: missing"
        if e.path not in sizes
        else f"{e.path}: {sizes[e.path]} bytes, expected {e.size}"
        for e in entries
        if sizes.get(e.path) != e.size
    ]
    if deep and not problems:
        for e in entries:
            with store.open(e.path) as f:
                if sha256_stream(f) != e.sha256:
                    problems.append(f"{e.path}: sha256 differs from the manifest")
    if problems:
        raise VerifyError(
            f"{uri} does not match its manifest ({len(problems)} of {len(entries)} files): "
            + "; ".join(problems[:5])
            + ". Re-upload the directory with upload_dir."
        )
    return entries


def download_dir(
    uri: str,
    local_dir: str | Path,
    config: StorageConfig | None = None,
    entries: list[FileEntry] | None = None,
) -> Path:
    """Download the files listed in `uri`'s manifest (or only `entries`, a subset of it) into
    `local_dir` and check their sha256. Files download a few at a time, each streamed to disk
    in parallel parts (boto3's transfer manager)."""
    from concurrent.futures import ThreadPoolExecutor

    store = _open_store(uri, config)
    root = Path(local_dir)
    wanted = entries if entries is not None else _manifest(store)

    def fetch(entry: FileEntry) -> str | None:  # the path if its bytes differ from the manifest
        target = root / entry.path
        target.parent.mkdir(parents=True, exist_ok=True)
        store.get(entry.path, target)
        with target.open("rb") as f:
            return entry.path if sha256_stream(f) != entry.sha256 else None

    with ThreadPoolExecutor(max_workers=_PARALLEL_FILES) as pool:
        bad = [path for path in pool.map(fetch, wanted) if path]
    if bad:
        raise VerifyError(
            f"{uri}: downloaded {', '.join(bad[:5])} differ from the manifest (corrupt objects); "
            "re-upload the directory with upload_dir."
        )
    return root


def copy_dir(src: str, dst: str, config: StorageConfig | None = None) -> list[FileEntry]:
    """Copy the complete upload at `src` to `dst` inside the store (S3: server-side CopyObject,
    nothing downloaded), manifest last; write-once like a checkpoint upload: a `dst` that
    already holds the same files is a no-op (a retry), other files raise AlreadyStoredError."""
    source, target = _open_store(src, config), _open_store(dst, config)
    entries = _manifest(source)
    if target.read_text(MANIFEST) is not None:
        if _manifest(target) == entries:
            return entries
        raise AlreadyStoredError(f"{dst} already holds a complete upload with other files.")
    for entry in _missing(target, entries):
        if type(source) is type(target):
            target.copy(source, entry)
        else:  # another kind of store: through a local file
            with tempfile.TemporaryDirectory(prefix="sparring-copy-") as tmp:
                source.get(entry.path, Path(tmp) / "file")
                target.put(Path(tmp) / "file", entry)
    target.write_text(MANIFEST, json.dumps({"files": [e.__dict__ for e in entries]}, indent=1))
    return entries


def add_files(
    local_dir: str | Path, uri: str, config: StorageConfig | None = None
) -> list[FileEntry]:
    """Add the files of `local_dir` to the complete upload at `uri` (e.g. MLflow's files beside
    a stored checkpoint), then rewrite its manifest with them: readers see the old manifest or
    the new one, never none. Paths the manifest already lists are kept as they are (a retry
    adds nothing). Returns the new manifest's entries."""
    store = _open_store(uri, config)
    entries = _manifest(store)
    known = {e.path for e in entries}
    added = [e for e in scan_dir(local_dir) if e.path not in known]
    for entry in added:
        store.put(Path(local_dir) / entry.path, entry)
    if added:
        entries = sorted(entries + added, key=lambda e: e.path)
        store.write_text(MANIFEST, json.dumps({"files": [e.__dict__ for e in entries]}, indent=1))
    return entries


def delete_dir(uri: str, config: StorageConfig | None = None) -> int:
    """Delete every object under `uri`, its manifest first (so it never looks complete while
    going); returns how many were deleted (0 for an empty or absent folder)."""
    store = _open_store(uri, config)
    objects = store.sizes()
    store.delete(MANIFEST)
    for rel in objects:
        if rel != MANIFEST:
            store.delete(rel)
    return len(objects)
