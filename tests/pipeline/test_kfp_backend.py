"""The pipeline as the KFP 2.14–2.17 backend runs it, not as kfp.local does: every task from the
compiled IR's own executor command, with the executor input the backend's driver and launcher
write (tests/pipeline/kfp_backend.py), against the real SeaweedFS and MLflow; plus static checks
over the compiled IR."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from kfp_backend import Backend

from sparring.loop import runs
from sparring.loop.config import PipelineConfig
from sparring.registry import resolve_model_uri
from sparring.tracking import ITERATION_TAG, connect

# kfp.local's run (shared with test_pipeline_e2e) and 2 backend runs: ~35 task processes.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]

SIDE_EFFECTS = ("start", "rollout", "train", "evaluate", "register", "finish")
CRASH = "sparring.registry:publish"  # register-1's first pod dies once its version exists


def backend(cfg: PipelineConfig, s3_server, tmp_path: Path, zygote) -> Backend:
    return Backend.for_config(cfg, s3_server, tmp_path, zygote.run)


def versions(client, name: str) -> list:
    return sorted(client.search_model_versions(f"name = '{name}'"), key=lambda v: int(v.version))


@pytest.fixture(scope="module")
def backend_run(tiny_run, s3_server, tmp_path_factory, zygote):
    """The tiny pipeline's kfp.local run (conftest), then a backend run of the same config
    with 2 retries per task, displayed as "nightly" and keyed on its run id (no `run_name`):
    it retries each side-effect task once after it succeeded (iteration 0's for the
    per-iteration ones) and has register-1's first pod killed right after it registered the
    checkpoint (Argo retries it). Two runs of one display name: tests/pipeline/
    test_run_identity.py."""
    local_cfg, local = tiny_run
    k8s = local_cfg.kubernetes.model_copy(update={"retries": 2})
    cfg = local_cfg.model_copy(
        update={
            "run_name": None,
            "registered_model": f"kfp-{uuid.uuid4().hex[:6]}",
            "kubernetes": k8s,
        }
    )
    tmp = tmp_path_factory.mktemp("kfp-backend")
    retry = {"start", "rollout-0", "train-0", "evaluate-0", "register-0", "finish"}
    a = backend(cfg, s3_server, tmp / "a", zygote).run(
        str(uuid.uuid4()), "nightly", retry=retry, fail={"register-1": CRASH}
    )
    return cfg, local_cfg, local, a, retry


def _by_name(result) -> dict:
    return {run.name: run for run in result.tasks.values()}


def test_backend_run_registers_what_kfp_local_registers(backend_run):
    cfg, local_cfg, local, a, _ = backend_run
    client = connect(cfg.tracking)
    assert a.state == "COMPLETE", _failure(a)
    ours = versions(client, cfg.registered_model)[:2]
    theirs = versions(client, local_cfg.registered_model)
    assert (
        [v.tags["iteration"] for v in ours] == [v.tags["iteration"] for v in theirs] == ["0", "1"]
    )
    assert [v.tags["score"] for v in ours] == [v.tags["score"] for v in theirs]
    job_id = _by_name(a)["start"].executor_input["inputs"]["parameterValues"]["job_id"]
    for v in ours:  # keyed on the run's unique id, not its display name
        checkpoint = resolve_model_uri(f"models:/{cfg.registered_model}/{v.version}", client)
        assert checkpoint == f"{cfg.storage.root}/{job_id}/{v.tags['iteration']}/checkpoint"
    parent = runs.find_parent(cfg, client, job_id)
    assert parent.info.status == "FINISHED" and parent.data.tags["kfp.run_name"] == "nightly"
    assert client.get_run(local.parent_run_id).info.status == "FINISHED"
    champion = client.get_model_version_by_alias(cfg.registered_model, "champion")
    assert a.outputs["champion_version"] == str(champion.version)  # the pipeline's outputs
    assert a.outputs["champion_score"] == pytest.approx(float(champion.tags["score"]))
    summary = _by_name(a)["finish"]
    assert f"v{champion.version}" in summary.log and parent.info.run_id in summary.log


def test_the_backend_executor_input_is_what_the_launcher_writes(backend_run):
    _, _, _, a, _ = backend_run
    tasks = _by_name(a)
    consumed = tasks["register-0"].executor_input["inputs"]["artifacts"]["eval_metrics"]
    metadata = consumed["artifacts"][0]["metadata"]
    assert metadata["display_name"] == "metrics" and isinstance(metadata["store_session_info"], str)
    assert consumed["artifacts"][0]["uri"].startswith("s3://")
    status = tasks["finish"].executor_input["inputs"]["parameterValues"]["status"]
    assert status["state"] == "COMPLETE"


def test_every_side_effect_task_retried_once_duplicates_nothing(backend_run):
    cfg, _, _, a, retry = backend_run
    tasks = _by_name(a)
    steps = {name.rsplit("-", 1)[0] for name in retry}
    assert steps == set(SIDE_EFFECTS) and all(tasks[name].tries == 2 for name in retry)
    client = connect(cfg.tracking)
    job_id = tasks["start"].executor_input["inputs"]["parameterValues"]["job_id"]
    experiment = client.get_experiment_by_name(cfg.tracking.experiment).experiment_id
    parents = client.search_runs([experiment], f"tags.`{runs.JOB_TAG}` = '{job_id}'")
    assert len(parents) == 1  # the retried start reused its parent run
    children = client.search_runs(
        [experiment], f"tags.mlflow.parentRunId = '{parents[0].info.run_id}'"
    )
    assert sorted(c.data.tags[ITERATION_TAG] for c in children) == ["0", "1"]
    mine = [
        v
        for v in versions(client, cfg.registered_model)
        if v.run_id in {c.info.run_id for c in children}
    ]
    assert sorted(v.tags["iteration"] for v in mine) == ["0", "1"]  # no duplicate version
    history = client.get_metric_history(parents[0].info.run_id, cfg.champion_metric)
    assert sorted(m.step for m in history) == [0, 1]  # no duplicate metric points


def test_a_task_killed_mid_way_is_retried_and_loses_nothing(backend_run):
    """register-1's first pod dies after registering (exit 137, nothing after it logged) at its
    timeout on Argo's clock; its backoffMaxDuration, counted from that first start, leaves the
    retry its whole timeout. The retry finds the version (no duplicate: the test above) and
    logs what the first pod never did: the iteration's artifacts and datasets, its run closed."""
    cfg, _, _, a, _ = backend_run
    register = _by_name(a)["register-1"]
    first, second = register.attempts
    assert first.failed and not second.failed and register.returncode == 0
    timeout = cfg.kubernetes.step_resources("register").timeout_seconds
    assert first.finished - first.started == pytest.approx(timeout)
    assert first.deadline == second.deadline == timeout
    assert second.started == first.finished + 30  # the first backoff
    client = connect(cfg.tracking)
    job_id = _by_name(a)["start"].executor_input["inputs"]["parameterValues"]["job_id"]
    parent = runs.find_parent(cfg, client, job_id)
    experiment = client.get_experiment_by_name(cfg.tracking.experiment).experiment_id
    (child,) = client.search_runs(
        [experiment],
        f"tags.mlflow.parentRunId = '{parent.info.run_id}' and tags.`{ITERATION_TAG}` = '1'",
    )
    assert child.info.status == "FINISHED"  # register's last act, after every log call
    logged = {a.path for a in client.list_artifacts(child.info.run_id)}
    assert "games.jsonl" in logged, logged
    assert client.get_run(child.info.run_id).inputs.dataset_inputs  # samples, game-init


def test_the_mlflow_plugins_task_run_is_not_the_parent(backend_run):
    cfg, _, _, a, _ = backend_run
    client = connect(cfg.tracking)
    plugin = client.get_experiment_by_name("kfp-plugin").experiment_id
    injected = {r.info.run_id for r in client.search_runs([plugin])}
    job_id = _by_name(a)["start"].executor_input["inputs"]["parameterValues"]["job_id"]
    parent = runs.find_parent(cfg, client, job_id)
    assert parent.info.run_id not in injected
    kfp_experiment = client.get_experiment_by_name(cfg.tracking.experiment).experiment_id
    for run_id in injected:  # nothing hangs under a task's run
        assert not client.search_runs([kfp_experiment], f"tags.mlflow.parentRunId = '{run_id}'")


def test_a_run_parameter_conflicting_with_the_config_stops_the_run_in_start(
    tiny_run, s3_server, tmp_path, zygote
):
    cfg = tiny_run.cfg.model_copy(update={"run_name": None})
    be = backend(cfg, s3_server, tmp_path, zygote)
    changed = cfg.model_copy(update={"registered_model": "from-config"}).model_dump_json()
    result = be.run(str(uuid.uuid4()), "conflict", {"config": changed, "registered_model": "x"})
    tasks = _by_name(result)
    assert result.state == "FAILED" and tasks["start"].returncode != 0
    assert "registered_model='x' conflicts with the `config` parameter" in tasks["start"].log
    assert "game-init" not in tasks  # nothing ran after start
    assert tasks["finish"].returncode == 0 and "config was rejected" in tasks["finish"].log


def _failure(result) -> str:
    failed = [r for r in result.tasks.values() if r.returncode]
    return failed[0].log[-3000:] if failed else ""
