"""Argo's retries of the compiled pipeline's tasks (tests/pipeline/kfp_backend.next_attempt,
from argo-workflows' processNodeRetries): the committed GPU pipeline (2 retries) retries a task
that failed at its timeout, each time with its whole timeout, where KFP's default
backoffMaxDuration (3600 s from the first attempt) gave a GPU task no retry at all."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from kfp_backend import Attempt, next_attempt

from sparring.loop.config import RETRY_SLACK_SECONDS, PipelineConfig

ROOT = Path(__file__).resolve().parents[2]
SPEC, PLATFORM = yaml.safe_load_all((ROOT / "pipelines" / "selfplay.yaml").read_text())
EXECUTORS = PLATFORM["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
DAGS = [SPEC["root"]["dag"], *(c["dag"] for c in SPEC["components"].values() if "dag" in c)]
TASKS = {  # display name (train-0) -> (its IR retryPolicy, its pod's activeDeadlineSeconds)
    task["taskInfo"]["name"]: (
        task["retryPolicy"],
        float(EXECUTORS[label]["activeDeadlineSeconds"]),
    )
    for dag in DAGS
    for task in dag["tasks"].values()
    if (label := SPEC["components"][task["componentRef"]["name"]].get("executorLabel"))
}
GPU = PipelineConfig.from_yaml(ROOT / "configs" / "pipeline-gpu.yaml").kubernetes
KFP_DEFAULT = {"maxRetryCount": 2, "backoffDuration": "30s", "backoffFactor": 2.0}  # 3600s max


def fail_at_timeout(retry: dict, timeout: float, policy: str = "Always") -> tuple[list, str]:
    """Every pod of the task fails at its deadline; the attempts Argo makes, then why it stops."""
    attempts = [Attempt(0.0, timeout, True, timeout)]
    while not isinstance(after := next_attempt(retry, attempts, timeout, policy), str):
        start, deadline = after
        attempts.append(Attempt(start, start + deadline, True, deadline))
    return attempts, after


def test_a_gpu_train_failing_at_its_timeout_is_retried_with_its_whole_timeout():
    retry, timeout = TASKS["train-0"]
    assert (retry["maxRetryCount"], timeout) == (2, 43200)
    # maxDuration = 3 attempts x (43200 s + 600 s to be scheduled) + backoffs 30 + 60 = 131490
    assert retry["backoffMaxDuration"] == "131490s"
    attempts, stop = fail_at_timeout(retry, timeout)
    # starts: 0; 43200 + 30 = 43230; 43230 + 43200 + 60 = 86490: each gets 43200 s
    assert [(a.started, a.deadline) for a in attempts] == [
        (0, 43200),
        (43230, 43200),
        (86490, 43200),
    ]
    assert stop == "No more retries left"


def test_kfps_default_max_duration_gave_that_task_no_retry_and_cut_an_early_ones():
    """The IR before: backoffMaxDuration 3600 s (KFP's default), counted from the first start."""
    attempts, stop = fail_at_timeout(KFP_DEFAULT, 43200)
    assert len(attempts) == 1 and stop == "Max duration limit exceeded"
    early = [Attempt(0.0, 600.0, True, 43200)]  # failed after 10 minutes
    assert next_attempt(KFP_DEFAULT, early, 43200) == (630, 2970)  # killed at the hour


@pytest.mark.parametrize("name", sorted(TASKS))
def test_every_task_gets_all_its_retries_each_with_its_whole_timeout(name):
    retry, timeout = TASKS[name]
    attempts, stop = fail_at_timeout(retry, timeout + RETRY_SLACK_SECONDS)
    assert len(attempts) == retry["maxRetryCount"] + 1 == 3, stop
    assert all(a.deadline == timeout + RETRY_SLACK_SECONDS for a in attempts)
    step = name.rsplit("-", 1)[0] if name[-1].isdigit() else name
    assert retry["backoffMaxDuration"] == f"{GPU.retry_max_duration(step)}s"


def test_a_failure_is_retried_only_under_a_policy_that_retries_failures():
    """KFP's IR carries no Argo retryPolicy: the cluster's decides. The KFP 2.17 manifests'
    templateDefaults (OnError) would leave a failed command unretried (docs/cluster.md)."""
    retry, timeout = TASKS["register-0"]
    failed = [Attempt(0.0, 60.0, True, timeout)]
    assert next_attempt(retry, failed, timeout, "OnError").startswith("a failure is not retried")
    assert next_attempt(retry, failed, timeout, "OnFailure") == (90, timeout)
    assert next_attempt(retry, failed, timeout, "Always") == (90, timeout)
