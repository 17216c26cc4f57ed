"""The tiny two-iteration pipeline, run once per session under kfp.local: the end-to-end test
and the KFP-backend harness (which compares its own run with this one) share it, and under
xdist both files run on one worker (TOGETHER in tests/conftest.py), so it is built once. Task
processes are forked from the preloaded zygote (tests/zygote.py, the `zygote` fixture)."""

from __future__ import annotations

import shutil
from typing import NamedTuple

import pytest
from sparring.pipelines.local import run_kfp
from tiny_pipeline import tiny_config
from zygote import Zygote

from sparring.loop.config import PipelineConfig
from sparring.loop.local import LocalRun, run_local


class TinyRun(NamedTuple):
    cfg: PipelineConfig
    result: LocalRun


def fork_kfp_local_tasks(zygote: Zygote, mp: pytest.MonkeyPatch) -> None:
    """kfp.local's SubprocessRunner starts each task as a child of `zygote`."""
    from kfp.local import subprocess_task_handler

    mp.setattr(subprocess_task_handler, "run_local_subprocess", zygote.run_local_subprocess)


@pytest.fixture
def forked_tasks(zygote, monkeypatch) -> None:
    """For this test, kfp.local's tasks fork from the zygote."""
    fork_kfp_local_tasks(zygote, monkeypatch)


@pytest.fixture(scope="session")
def tiny_run(s3_server, tiny_model_dir, tmp_path_factory, zygote, mlflow_template) -> TinyRun:
    """`tiny_config` run under kfp.local (`sparring run --kfp`'s path), the S3 variables set
    only while it runs; its MLflow store starts as a copy of the migrated template."""
    tmp = tmp_path_factory.mktemp("tiny-run")
    shutil.copyfile(mlflow_template, tmp / "mlflow.db")
    cfg = tiny_config(tmp, str(tiny_model_dir), s3_server)
    with pytest.MonkeyPatch.context() as mp:
        fork_kfp_local_tasks(zygote, mp)
        for key, value in s3_server.env().items():
            mp.setenv(key, value)
        return TinyRun(cfg, run_local(cfg, tmp / "runs", engine=run_kfp))
