"""`sparring run`'s summary says how to open the MLflow UI on the store the run used."""

from __future__ import annotations

import shlex
from pathlib import Path

from mlflow.cli import cli as mlflow_cli

from sparring.loop.local import mlflow_ui
from sparring.tracking import TrackingConfig


def test_the_local_server_is_served_again_the_way_it_ran(tmp_path):
    tracking = TrackingConfig(tracking_uri="http://127.0.0.1:5123", artifacts_destination="s3://b")
    command = mlflow_ui(tracking, tmp_path / "mlflow").split(", then open ")[0]
    argv = shlex.split(command)
    assert argv[:2] == ["mlflow", "server"]
    # every option is one `mlflow server` takes, with the store and artifact layout of the run
    server = mlflow_cli.commands["server"]
    ctx = server.make_context("server", argv[2:], resilient_parsing=True)
    assert ctx.params["backend_store_uri"] == f"sqlite:///{tmp_path / 'mlflow' / 'mlflow.db'}"
    assert ctx.params["serve_artifacts"] and ctx.params["artifacts_destination"] == "s3://b"
    assert ctx.params["default_artifact_root"] == "mlflow-artifacts:/mlflow"


def test_a_configured_server_is_opened_and_a_sqlite_store_gets_mlflow_ui():
    assert mlflow_ui(TrackingConfig(tracking_uri="https://mlflow.example.com"), None) == (
        "open https://mlflow.example.com"
    )
    sqlite = TrackingConfig(tracking_uri=f"sqlite:///{Path('/data/mlflow.db')}")
    assert mlflow_ui(sqlite, None).startswith("mlflow ui --backend-store-uri sqlite:////data/")
