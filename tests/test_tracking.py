"""Tracking against a real MLflow sqlite store and a real `mlflow server --serve-artifacts`
process on a real SeaweedFS bucket (the registry: tests/test_registry.py)."""

from __future__ import annotations

import time
import uuid

import pytest
import requests

from sparring.dev.mlflowserver import MlflowServer
from sparring.dev.s3server import free_ports
from sparring.tracking import (
    ITERATION_TAG,
    PipelineRun,
    TrackingConfig,
    TrackingUnavailableError,
    connect,
)

METRIC = "eval/selfplay/player_a/normalized_reward"


@pytest.fixture(scope="module")
def tracking(tmp_path_factory) -> TrackingConfig:
    """A real MLflow sqlite store (tracking + registry) shared by this module's tests."""
    db = tmp_path_factory.mktemp("mlflow") / "mlflow.db"
    return TrackingConfig(tracking_uri=f"sqlite:///{db}", experiment="test-" + uuid.uuid4().hex[:6])


def test_pipeline_run_params_metrics_children_artifacts(tracking, tmp_path):
    params = {"rollout": {"games_per_init": 4, "group_key": "init"}, "seed": 1}
    with PipelineRun.start(tracking, "pipe", params=params) as run:
        for i, reward in enumerate([0.2, 0.5]):
            run.log_metrics(i, {METRIC: reward})
        (tmp_path / "reward.png").write_bytes(b"png")
        run.log_artifact(tmp_path / "reward.png", iteration=1, dest="plots")
    client = run.client
    parent = client.get_run(run.run_id)
    assert parent.data.params == {
        "rollout.games_per_init": "4",
        "rollout.group_key": "init",
        "seed": "1",
    }
    assert parent.info.status == "FINISHED"
    history = client.get_metric_history(run.run_id, METRIC)
    assert [(m.step, m.value) for m in history] == [(0, 0.2), (1, 0.5)]
    children = client.search_runs(
        [run.experiment_id], f"tags.mlflow.parentRunId = '{run.run_id}'", order_by=["start_time"]
    )
    assert sorted(c.data.tags[ITERATION_TAG] for c in children) == ["0", "1"]
    child1 = run.iteration_run(1)
    assert client.get_run(child1).data.metrics == {METRIC: 0.5}
    assert [a.path for a in client.list_artifacts(child1, "plots")] == ["plots/reward.png"]
    # A later task of the same pipeline finds the same child runs.
    assert PipelineRun.attach(run.run_id, tracking).iteration_run(1) == child1


def test_injected_task_run_id_is_not_the_parent(tracking, monkeypatch):
    """KFP 2.17's MLflow plugin injects a nested run per task: the pipeline's parent is ours."""
    client = connect(tracking)
    exp = client.get_experiment_by_name(tracking.experiment) or client.get_experiment(
        client.create_experiment(tracking.experiment)
    )
    kfp_task = client.create_run(exp.experiment_id, run_name="kfp-task").info.run_id
    monkeypatch.setenv("MLFLOW_RUN_ID", kfp_task)
    with PipelineRun.start(tracking, params={"seed": 3}) as run:
        child = run.iteration_run(0)
    assert run.run_id != kfp_task
    assert client.get_run(child).data.tags["mlflow.parentRunId"] == run.run_id
    assert client.get_run(kfp_task).info.status == "RUNNING"  # KFP's, left alone
    assert client.get_run(run.run_id).data.params == {"seed": "3"}


def test_mlflow_unreachable_fails_fast():
    (port,) = free_ports(1)
    start = time.monotonic()
    with pytest.raises(TrackingUnavailableError, match=f"127.0.0.1:{port}.*MLFLOW_TRACKING_URI"):
        PipelineRun.start(TrackingConfig(tracking_uri=f"http://127.0.0.1:{port}", probe_timeout=2))
    assert time.monotonic() - start < 5


def test_mlflow_server_with_s3_artifacts(s3_server, tmp_path):
    with MlflowServer(tmp_path / "mlflow", "s3://sparring", s3_server.env()) as server:
        config = TrackingConfig(tracking_uri=server.url, experiment="server-test")
        with PipelineRun.start(config, "pipe", params={"seed": 1}) as run:
            run.log_metrics(0, {METRIC: 0.7})
            (tmp_path / "games.jsonl").write_text('{"reward": 0.7}\n')
            run.log_artifact(tmp_path / "games.jsonl", iteration=0, dest="games")
            artifact_uri = run.client.get_run(run.iteration_run(0)).info.artifact_uri
    assert artifact_uri.startswith("mlflow-artifacts:/mlflow/")  # proxied, as in the chart
    listing = s3_server.client().list_objects_v2(Bucket="sparring", Prefix="mlflow/")["Contents"]
    assert any(o["Key"].endswith("games/games.jsonl") for o in listing)


def test_mlflow_server_moves_off_a_port_taken_before_it_binds(tmp_path):
    """Another process binds the chosen port first (the race `free_ports` can't exclude): the
    server starts on a fresh port instead of failing."""
    import socket

    server = MlflowServer(tmp_path / "mlflow", str(tmp_path / "artifacts"))
    taken = server.port
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", taken))
        squatter.listen()
        with server:
            assert server.port != taken
            assert requests.get(f"{server.url}/health", timeout=5).ok
