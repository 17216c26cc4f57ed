"""The tiny two-iteration pipeline, run once per session under kfp.local: the end-to-end test
and the KFP-backend harness (which compares its own run with this one) share it, and under
xdist both files run on one worker (TOGETHER in tests/conftest.py), so it is built once."""

from __future__ import annotations

from typing import NamedTuple

import pytest
from sparring.pipelines.local import run_kfp
from tiny_pipeline import tiny_config

from sparring.loop.config import PipelineConfig
from sparring.loop.local import LocalRun, run_local


class TinyRun(NamedTuple):
    cfg: PipelineConfig
    result: LocalRun


@pytest.fixture(scope="session")
def tiny_run(s3_server, tiny_model_dir, tmp_path_factory) -> TinyRun:
    """`tiny_config` run under kfp.local (`sparring run`'s path), the S3 variables set only
    while it runs."""
    tmp = tmp_path_factory.mktemp("tiny-run")
    cfg = tiny_config(tmp, str(tiny_model_dir), s3_server)
    with pytest.MonkeyPatch.context() as mp:
        for key, value in s3_server.env().items():
            mp.setenv(key, value)
        return TinyRun(cfg, run_local(cfg, tmp / "runs", engine=run_kfp))
