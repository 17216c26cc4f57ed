"""`sparring run` stopped by a real SIGTERM: the local S3 server stops, the MLflow parent run is
KILLED, the partial artifacts are named and the exit status is 128 + 15; a SIGTERM while the
S3 server is still starting stops it too."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from sparring.loop import runs
from sparring.loop.config import PipelineConfig
from sparring.tracking import connect

pytestmark = pytest.mark.slow


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _start(tmp_path: Path, mlflow_db: str) -> tuple[subprocess.Popen, dict]:
    """`sparring run` of a tiny config in a subprocess, its S3 server started by the run."""
    config = {
        "game": {"params": {"k": 3, "max_turns": 2}},
        "iterations": 2,
        "games_per_iteration": 4,
        "device": "cpu",
        "game_init": {"num_train": 4, "num_val": 1},
        "rollout": {"games_per_init": 2, "sampling": {"max_new_tokens": 8}},
        "storage": {"root": "s3://sparring/stopped"},  # no endpoint: `run` starts SeaweedFS
        "tracking": {"tracking_uri": mlflow_db, "experiment": "stop"},
    }
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "MLFLOW_"))}
    command = [str(Path(sys.executable).parent / "sparring"), "run", "--config", str(path)]
    command += ["--workdir", str(tmp_path / "runs"), "--run-name", "stopped-run"]
    proc = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    return proc, config


def test_sigterm_stops_the_services_and_kills_the_parent_run(tmp_path: Path, mlflow_db: str):
    proc, config = _start(tmp_path, mlflow_db)
    lines, port = [], None
    for line in proc.stdout:  # wait until the services are up and a task runs
        lines.append(line)
        if found := re.search(r"local S3 \(SeaweedFS\) at http://127\.0\.0\.1:(\d+)", line):
            port = int(found.group(1))
        if "game-init" in line:  # the in-process loop's first stage
            break
    assert port and _listening(port), "".join(lines)
    time.sleep(2)  # the task's process is running
    proc.send_signal(signal.SIGTERM)
    out = proc.communicate(timeout=60)[0]
    assert proc.returncode == 128 + signal.SIGTERM, "".join(lines) + out
    deadline = time.monotonic() + 10
    while _listening(port) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _listening(port)
    # stored under the run's id, not its display name (run identity)
    stored = re.search(r"partial artifacts in s3://sparring/stopped/([\w-]+-[0-9a-f]{32})\b", out)
    assert stored and "s3://sparring/stopped/stopped-run" not in out
    cfg = PipelineConfig.model_validate(config)
    parent = runs.find_parent(cfg, connect(cfg.tracking), stored.group(1), tag=runs.RUN_TAG)
    assert parent.info.status == "KILLED"


def test_sigterm_while_the_s3_server_starts_stops_it(tmp_path: Path, mlflow_db: str):
    import psutil

    proc, _ = _start(tmp_path, mlflow_db)
    deadline, weed = time.monotonic() + 60, None
    while weed is None and time.monotonic() < deadline:  # the server process, before it serves
        kids = psutil.Process(proc.pid).children(recursive=True)
        weed = next((p for p in kids if p.name() == "weed"), None)
        time.sleep(0.05)
    assert weed is not None, "the S3 server never started"
    proc.send_signal(signal.SIGTERM)
    out = proc.communicate(timeout=60)[0]
    assert proc.returncode == 128 + signal.SIGTERM, out
    assert "stopped by SIGTERM outside the loop's tasks: the local services stopped" in out
    weed.wait(timeout=10)  # raises psutil.TimeoutExpired if the server outlived the run
