"""`average: {source: tables}` as the KFP backend runs it (tests/pipeline/kfp_backend.py):
Kuhn Poker's tiny one-iteration pipeline whose `average` task reads the evaluations that the
backend's evaluate pods stored under the run's id, distills their mixture, and whose
`register-average` (retried once after it succeeded) registers one version under the alias
`average` in a child run of its own, against the real SeaweedFS and MLflow."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import pytest
from kfp_backend import Backend, s3_credentials

from sparring import storage
from sparring.cli.options import load_config, parse_params
from sparring.loop import runs
from sparring.loop.config import PipelineConfig
from sparring.registry import resolve_model_uri
from sparring.tracking import ITERATION_TAG, MEMBER_TAG, connect

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]
ROOT = Path(__file__).resolve().parents[2]
# configs/kuhn.yaml at the smallest size that plays, trains, evaluates and averages
TINY = ("iterations=1", "games_per_iteration=8", "game_init.num_train=4", "game_init.num_val=1")
TINY += ("warm_start=null", "rollout.games_per_init=2", "train.mini_batch_size=8")
TINY += ("train.micro_batch_size=8", "eval.modes=[selfplay]", "eval.baselines=false")
TINY += ("champion_metric=eval/selfplay/all/normalized_reward",)
TINY += ("average={source: tables, train: {steps: 2, micro_batch_size: 24}}",)


@pytest.fixture(scope="module")
def averaged(s3_server, tiny_model_dir, tmp_path_factory, zygote, mlflow_template):
    pytest.importorskip("pyspiel")
    tmp = tmp_path_factory.mktemp("kfp-average")
    shutil.copyfile(mlflow_template, tmp / "mlflow.db")
    tag = uuid.uuid4().hex[:6]
    sets = (*TINY, f"model={tiny_model_dir}", f"registered_model=kuhn-{tag}")
    sets += (
        f"storage.root=s3://sparring/avg-{tag}",
        f"storage.endpoint_url={s3_server.endpoint_url}",
    )
    sets += (f"tracking.tracking_uri=sqlite:///{tmp / 'mlflow.db'}", "run_name=null")
    cfg = load_config(PipelineConfig, str(ROOT / "configs" / "kuhn.yaml"), parse_params(sets))
    backend = Backend.for_config(cfg, s3_server, tmp, zygote.run)
    job_id = str(uuid.uuid4())
    return cfg, job_id, backend.run(job_id, "averaged", retry={"register-average"})


def test_the_average_distills_the_stored_evaluations_and_registers_once(averaged, s3_server):
    cfg, job_id, result = averaged
    tasks = {run.name: run for run in result.tasks.values()}
    failed = [r.log[-3000:] for r in tasks.values() if r.returncode]
    assert result.state == "COMPLETE", failed
    # it read the evaluations the backend's pods stored under the run's id
    assert tasks["average"].executor_input["inputs"]["parameterValues"]["run_name"] == job_id
    assert "iterations 0-0' tables distilled" in tasks["average"].log
    client = connect(cfg.tracking)
    version = client.get_model_version_by_alias(cfg.registered_model, "average")
    uri = resolve_model_uri(f"models:/{cfg.registered_model}/{version.version}", client)
    assert uri == f"{cfg.storage.root}/{job_id}/0/members/average/checkpoint"
    stored = {e.path for e in storage.verify(uri, s3_credentials(s3_server))}
    assert "model.safetensors" in stored
    # register-average ran twice: one version, in a child run of its own
    assert tasks["register-average"].tries == 2
    mine = client.search_model_versions(f"name = '{cfg.registered_model}'")
    assert sorted(v.tags["iteration"] for v in mine) == ["0", "0"]
    parent = runs.find_parent(cfg, client, job_id)
    experiment = client.get_experiment_by_name(cfg.tracking.experiment).experiment_id
    children = client.search_runs([experiment], f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    named = sorted((c.data.tags[ITERATION_TAG], c.data.tags.get(MEMBER_TAG, "")) for c in children)
    assert named == [("0", ""), ("0", "average")]
    (child,) = [c for c in children if c.data.tags.get(MEMBER_TAG) == "average"]
    assert version.run_id == child.info.run_id
    assert child.data.metrics["train/samples"] == 24  # both replies at Kuhn's 12 sets
