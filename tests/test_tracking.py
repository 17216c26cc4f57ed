"""Tracking and registry against a real MLflow sqlite store, a real `mlflow server` process and a
real SeaweedFS server; mocks only inject an upload fault."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from unittest import mock

import pytest
import requests
from test_storage import make_checkpoint, recording_put, s3_config

from sparring.dev.s3server import free_ports
from sparring.storage import (
    S3AuthError,
    S3UnreachableError,
    VerifyError,
    _S3Store,
    artifact_uri,
    upload_dir,
)
from sparring.tracking import (
    ITERATION_TAG,
    PipelineRun,
    TrackingConfig,
    TrackingUnavailableError,
    champion,
    connect,
    register_checkpoint,
    resolve_model_uri,
)

METRIC = "eval/selfplay/player_a/normalized_reward"


@pytest.fixture(scope="module")
def tracking(tmp_path_factory) -> TrackingConfig:
    """A real MLflow sqlite store (tracking + registry) shared by this module's tests."""
    db = tmp_path_factory.mktemp("mlflow") / "mlflow.db"
    return TrackingConfig(tracking_uri=f"sqlite:///{db}", experiment="test-" + uuid.uuid4().hex[:6])


def upload_checkpoint(server, tmp_path: Path, run: str, iteration: int) -> str:
    uri = artifact_uri("s3://sparring/runs", run, iteration, "checkpoint")
    upload_dir(make_checkpoint(tmp_path / f"ckpt{iteration}"), uri, s3_config(server))
    return uri


def versions(client, name: str) -> list:
    return client.search_model_versions(f"name='{name}'")


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


def test_injected_mlflow_run_id_becomes_the_parent(tracking, monkeypatch):
    client = connect(tracking)
    exp = client.get_experiment_by_name(tracking.experiment) or client.get_experiment(
        client.create_experiment(tracking.experiment)
    )
    kfp_run = client.create_run(exp.experiment_id, run_name="kfp-task").info.run_id
    monkeypatch.setenv("MLFLOW_RUN_ID", kfp_run)
    with PipelineRun.start(tracking, params={"seed": 3}) as run:
        assert run.run_id == kfp_run
        child = run.iteration_run(0)
    assert client.get_run(child).data.tags["mlflow.parentRunId"] == kfp_run
    assert client.get_run(kfp_run).info.status == "RUNNING"  # KFP owns it, we don't end it
    assert client.get_run(kfp_run).data.params == {"seed": "3"}


def test_champion_moves_only_on_improvement(tracking, s3_server, tmp_path):
    client, name = connect(tracking), "m-" + uuid.uuid4().hex[:6]
    storage = s3_config(s3_server)
    uris = [upload_checkpoint(s3_server, tmp_path, "champ", i) for i in range(4)]
    results = [
        register_checkpoint(
            name, uri, None, i, {METRIC: s}, s, client=client, storage_config=storage
        )
        for i, (uri, s) in enumerate(zip(uris, [0.3, 0.5, 0.4, 0.5], strict=True))
    ]
    assert [r.is_champion for r in results] == [True, True, False, False]  # a tie doesn't move it
    assert results[-1].champion_version == "2" and results[-1].champion_score == 0.5
    assert champion(name, client).version == 2
    v3 = client.get_model_version(name, "3")
    assert v3.source == uris[2]
    assert v3.tags == {"iteration": "2", "score": "0.4", METRIC: "0.4"}
    assert resolve_model_uri(f"models:/{name}@champion", client) == uris[1]
    assert resolve_model_uri(f"models:/{name}/4", client) == uris[3]
    assert resolve_model_uri(uris[0], client) == uris[0]
    with pytest.raises(ValueError, match="models:/<name>@<alias>"):
        resolve_model_uri("models:/only-a-name", client)


def test_interrupted_upload_is_not_registered_until_rerun(tracking, s3_server, tmp_path):
    client, name = connect(tracking), "m-" + uuid.uuid4().hex[:6]
    storage = s3_config(s3_server)
    uri = artifact_uri("s3://sparring/runs", uuid.uuid4().hex[:6], 0, "checkpoint")
    ckpt = make_checkpoint(tmp_path / "ckpt")
    with (
        mock.patch.object(_S3Store, "put", recording_put(_S3Store.put, [], fail_at=2)),
        pytest.raises(ConnectionError),
    ):
        upload_dir(ckpt, uri, storage)
    with pytest.raises(VerifyError, match="incomplete"):
        register_checkpoint(name, uri, None, 0, {}, 0.1, client=client, storage_config=storage)
    assert versions(client, name) == []

    upload_dir(ckpt, uri, storage)  # the rerun finishes it
    reg = register_checkpoint(name, uri, None, 0, {}, 0.1, client=client, storage_config=storage)
    assert reg.version == "1" and reg.is_champion


@pytest.mark.parametrize("fault", ["unreachable", "wrong-credentials"])
def test_s3_faults_register_nothing(fault, tracking, s3_server, tmp_path):
    client, name = connect(tracking), "m-" + uuid.uuid4().hex[:6]
    uri = upload_checkpoint(s3_server, tmp_path, "faults", 0)
    if fault == "unreachable":
        port = free_ports(1)[0]
        storage = s3_config(s3_server, endpoint_url=f"http://127.0.0.1:{port}")
        error = S3UnreachableError
    else:
        storage, error = s3_config(s3_server, secret_access_key="wrong"), S3AuthError
    with pytest.raises(error, match="127.0.0.1"):
        register_checkpoint(name, uri, None, 0, {}, 1.0, client=client, storage_config=storage)
    assert versions(client, name) == []


def test_mlflow_unreachable_fails_fast():
    (port,) = free_ports(1)
    start = time.monotonic()
    with pytest.raises(TrackingUnavailableError, match=f"127.0.0.1:{port}.*MLFLOW_TRACKING_URI"):
        PipelineRun.start(TrackingConfig(tracking_uri=f"http://127.0.0.1:{port}", probe_timeout=2))
    assert time.monotonic() - start < 5


@pytest.fixture(scope="module")
def mlflow_server(s3_server, tracking, tmp_path_factory):
    """A real `mlflow server` on sqlite whose run artifacts go to the SeaweedFS bucket."""
    root = tmp_path_factory.mktemp("mlflow-server")
    connect(tracking)  # a migrated database to start from saves the server ~5 s of migrations
    shutil.copy(tracking.resolved_uri().removeprefix("sqlite:///"), root / "mlflow.db")
    (port,) = free_ports(1)
    env = {**os.environ, **s3_server.env(), "MLFLOW_S3_ENDPOINT_URL": s3_server.endpoint_url}
    env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] = "false"  # no background job runner needed
    cmd = [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}", "--workers", "1"]
    cmd += ["--artifacts-destination", "s3://sparring/mlflow-artifacts"]
    log = (root / "server.log").open("wb")
    proc = subprocess.Popen(
        cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=root, start_new_session=True
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if requests.get(f"{url}/health", timeout=1).ok:
                    break
            except requests.RequestException:  # not listening yet, or busy starting
                pass
            assert proc.poll() is None and time.monotonic() < deadline, (
                root / "server.log"
            ).read_text()[-3000:]
            time.sleep(0.2)
        yield url
    finally:  # the server runs uvicorn and a job runner as children: stop the whole group
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_mlflow_server_with_s3_artifacts(mlflow_server, s3_server, tmp_path):
    config = TrackingConfig(tracking_uri=mlflow_server, experiment="server-test")
    storage = s3_config(s3_server)
    uri = upload_checkpoint(s3_server, tmp_path, "server", 0)
    with PipelineRun.start(config, "pipe", params={"seed": 1}) as run:
        run.log_metrics(0, {METRIC: 0.7})
        (tmp_path / "games.jsonl").write_text('{"reward": 0.7}\n')
        run.log_artifact(tmp_path / "games.jsonl", iteration=0, dest="games")
        reg = register_checkpoint(
            "server-model",
            uri,
            run.iteration_run(0),
            0,
            {METRIC: 0.7},
            0.7,
            client=run.client,
            storage_config=storage,
        )
    assert reg.is_champion
    assert resolve_model_uri("models:/server-model@champion", run.client) == uri
    keys = [
        o["Key"]
        for o in s3_server.client().list_objects_v2(Bucket="sparring", Prefix="mlflow-artifacts/")[
            "Contents"
        ]
    ]
    assert any(k.endswith("games/games.jsonl") for k in keys)
