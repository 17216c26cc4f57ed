"""A stand-in for the KFP 2.14–2.17 backend: runs a compiled pipeline's tasks one by one, each
from the IR's own executor command, with the executor input the backend's driver and launcher
write (read from kubeflow/pipelines at 2.17.0, see docs/pipeline.md):

- parameters: pipeline inputs, constants, `{{$.pipeline_job_uuid}}` / `{{$.pipeline_job_name}}`
  (backend/src/v2/driver/resolve.go), upstream outputs, and for the exit handler a
  `PipelineTaskFinalStatus` whose `state` is the MLMD execution state: COMPLETE or FAILED;
- input artifacts: `uri` (s3://), `name` (the MLMD id) and `metadata` = every MLMD custom
  property: what the producer wrote (numbers as doubles, booleans as ints) plus the strings
  `display_name` and `store_session_info` (backend/src/v2/metadata/{client,converter}.go);
- output artifacts under `<root>/<pipeline>/<run id>/<task>/<salt>/<name>`, the executor
  output file under that task root, output parameters in `/tmp/kfp/outputs/<name>` style files
  (driver.go provisionOutputs); the launcher downloads inputs from S3 to the SDK's local path
  (`/s3/<bucket>/<key>`, remapped here to a folder, as the pod's emptyDir would be) and uploads
  outputs after the command exits (launcher_v2.go);
- KFP 2.17's MLflow plugin: every task gets `MLFLOW_RUN_ID`, a nested run of its own;
- Argo's retries of a failed task (`next_attempt`, from argo-workflows' processNodeRetries), by
  the task's `retryPolicy` in the IR and the cluster's Argo retry policy, on an emulated clock
  where a failed attempt took its pod's whole `activeDeadlineSeconds` (the worst case).

    backend = Backend(ir_path, "s3://sparring/kfp", workdir, pod_env, storage_config)
    result = backend.run("0f3c…", "nightly", {"registered_model": "m"}, retry={"register-0"},
                         fail={"register-1": "sparring.registry:publish"})
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import urlparse

import yaml

from sparring.storage import StorageConfig

# What the launcher stores as `store_session_info` for an S3 pipeline root (provider session).
SESSION_INFO = {
    "Provider": "s3",
    "Params": {"region": "us-east-1", "endpoint": "", "disableSSL": "true", "fromEnv": "true"},
}
# Redirects the SDK's `/s3/` mount prefix to the folder the harness downloads into.
SITECUSTOMIZE = """import os
import kfp.dsl.types.artifact_types as t
t._S3_LOCAL_MOUNT_PREFIX = os.environ["HARNESS_S3_MOUNT"]
crash = os.environ.get("HARNESS_CRASH_AFTER")
if crash:  # a pod killed right after `module:function` returns (injected fault)
    import importlib
    module, name = crash.split(":")
    module = importlib.import_module(module)
    original = getattr(module, name)
    def crashing(*args, **kwargs):
        original(*args, **kwargs)
        os._exit(137)
    setattr(module, name, crashing)
"""


Start = Callable[[list[str], dict[str, str]], tuple[int, str]]


def s3_credentials(s3_server) -> StorageConfig:
    """How the launcher (and a test) reaches `s3_server`."""
    return StorageConfig(
        endpoint_url=s3_server.endpoint_url,
        access_key_id=s3_server.access_key,
        secret_access_key=s3_server.secret_key,
    )


def run_command(command: list[str], env: dict[str, str]) -> tuple[int, str]:
    """A pod's command in a fresh process: its exit code and its output."""
    proc = subprocess.run(command, env=env, capture_output=True, text=True)
    return proc.returncode, proc.stdout + proc.stderr


class Attempt(NamedTuple):
    """One pod of a task, on the emulated clock (seconds)."""

    started: float
    finished: float
    failed: bool
    deadline: float  # the pod's activeDeadlineSeconds, as Argo capped it
    log: str = ""


@dataclass
class TaskRun:
    """One executed task: its outputs and how its command ended."""

    name: str
    returncode: int
    parameters: dict[str, Any] = field(default_factory=dict)
    artifacts: dict[str, dict] = field(default_factory=dict)  # name -> RuntimeArtifact (MLMD)
    executor_input: dict = field(default_factory=dict)
    log: str = ""
    tries: int = 1
    attempts: list[Attempt] = field(default_factory=list)  # with a retryPolicy: every pod


def next_attempt(
    retry: dict | None, attempts: list[Attempt], timeout: float, policy: str = "Always"
) -> tuple[float, float] | str:
    """When Argo starts a task's next pod and the deadline it gives it, as (start, deadline)
    on the clock of `attempts`; or why there is none. `retry`: the task's IR `retryPolicy`
    (KFP's compiler turns it into the Argo template's retryStrategy limit and backoff);
    `policy`: the Argo retryPolicy the cluster merges in (the IR has none: Argo's default is
    OnFailure, the KFP 2.17 manifests' templateDefaults say OnError); `timeout`: the pod's own
    activeDeadlineSeconds. argo-workflows workflow/controller/operator.go processNodeRetries:
    maxDuration counts from the first attempt's start; a backoff ending past it is not waited
    for; a retry's pod deadline is cut at it (executionDeadline)."""
    last = attempts[-1]
    if not last.failed:
        return "succeeded"
    if not retry:
        return "no retry policy"
    deadline = attempts[0].started + _seconds(retry.get("backoffMaxDuration", "3600s"))
    if last.finished > deadline:
        return "Max duration limit exceeded"
    factor = retry.get("backoffFactor", 2.0)
    wait = _seconds(retry.get("backoffDuration", "0s")) * factor ** (len(attempts) - 1)
    if last.finished + wait > deadline:
        return "Backoff would exceed max duration limit"
    if policy not in ("Always", "OnFailure"):  # the command failed: Argo's phase Failed
        return f"a failure is not retried under retryPolicy {policy}"
    if len(attempts) > retry.get("maxRetryCount", 0):
        return "No more retries left"
    start = last.finished + wait
    return start, min(timeout, deadline - start)


def _seconds(duration: str) -> float:
    """KFP's IR durations: whole seconds with an `s` ("3600s")."""
    return float(duration.removesuffix("s"))


@dataclass
class Result:
    """A pipeline run: every task (by name, in execution order) and the pipeline's outputs."""

    state: str  # the exit handler's state: COMPLETE or FAILED
    tasks: dict[str, TaskRun]
    outputs: dict[str, Any]


class Backend:
    """Runs the pipeline compiled at `ir_path`; see the module docstring."""

    def __init__(
        self,
        ir_path: Path,
        root: str,
        workdir: Path,
        env: dict[str, str],
        s3: StorageConfig,
        start: Start = run_command,
    ) -> None:
        """`env`: what the pods get besides the IR's own env (the Secret's keys, the MLflow
        plugin's MLFLOW_TRACKING_URI); `s3`: how the launcher reaches the pipeline root;
        `start`: how a pod's command runs (a fresh process, or tests/zygote.py's
        fork)."""
        self.spec, platform = yaml.safe_load_all(Path(ir_path).read_text())
        self.k8s = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
        self.root, self.workdir, self.env = root.rstrip("/"), Path(workdir), env
        self.start = start
        self.s3 = s3.client()
        site = self.workdir / "site"
        site.mkdir(parents=True, exist_ok=True)
        (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
        self._ids = self._pods = 0
        self.mount = self.workdir / "pod-0"

    @classmethod
    def for_config(cls, cfg, s3_server, workdir: Path, start: Start = run_command) -> Backend:
        """`cfg` (a PipelineConfig) compiled into `workdir`, run against `s3_server` (a
        tests/conftest.py S3Server) with its keys as the pods' Secret and MLflow as the
        config's tracking, under the pipeline root `s3://sparring/kfp-root`."""
        from sparring.pipelines.selfplay import compile_pipeline

        workdir.mkdir(parents=True, exist_ok=True)
        ir = Path(compile_pipeline(cfg, str(workdir / "pipeline.yaml")))
        secret = {k: s3_server.env()[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
        env = secret | {"MLFLOW_TRACKING_URI": cfg.tracking.tracking_uri}
        root = "s3://sparring/kfp-root"
        return cls(ir, root, workdir / "backend", env, s3_credentials(s3_server), start)

    # -- the driver -------------------------------------------------------------------------
    def run(
        self,
        job_id: str,
        job_name: str,
        params: dict[str, Any] | None = None,
        retry: set[str] = frozenset(),  # type: ignore[assignment]
        fail: dict[str, str] | None = None,
        policy: str = "Always",
    ) -> Result:
        """Run every task in dependency order, the exit handler last. The tasks named in
        `retry` run a second time with the same executor input after they succeeded; the
        first pod of a task in `fail` is killed right after the `module:function` it names
        returns, and a failed task is retried as Argo would (`next_attempt`, under `policy`)."""
        self.fail, self.policy, self.clock = dict(fail or {}), policy, 0.0
        root = self.spec["root"]
        inputs = {
            k: v.get("defaultValue") for k, v in root["inputDefinitions"]["parameters"].items()
        }
        inputs |= params or {}
        self.job_id, self.job_name = job_id, job_name
        done: dict[str, TaskRun] = {}
        state = "COMPLETE"
        for key, task in self._ordered(root["dag"]["tasks"]):
            component = self.spec["components"][task["componentRef"]["name"]]
            if "dag" in component:  # the exit handler's group: its tasks see the root's inputs
                sub_inputs = {
                    name: self._parameter(spec, inputs, done, state)
                    for name, spec in task["inputs"].get("parameters", {}).items()
                }
                for sub_key, sub in self._ordered(component["dag"]["tasks"]):
                    run = self._execute(sub_key, sub, sub_inputs, done, state, retry)
                    done[sub_key] = run
                    if run.returncode:
                        state = "FAILED"
                        break
                done[key] = TaskRun(key, 0 if state == "COMPLETE" else 1)
            else:
                done[key] = self._execute(key, task, inputs, done, state, retry)
        outputs = {
            name: done[src["valueFromParameter"]["producerSubtask"]].parameters.get(
                src["valueFromParameter"]["outputParameterKey"]
            )
            for name, src in root["dag"].get("outputs", {}).get("parameters", {}).items()
        }
        return Result(state, done, outputs)

    def _ordered(self, tasks: dict[str, dict]) -> list[tuple[str, dict]]:
        """Tasks in an order that respects `dependentTasks` and data dependencies."""
        order: list[str] = []

        def visit(key: str) -> None:
            if key in order:
                return
            task = tasks[key]
            if "iteratorPolicy" in task or "parameterIterator" in task:
                raise NotImplementedError("the harness does not run ParallelFor")
            for dep in task.get("dependentTasks", []):
                visit(dep)
            order.append(key)

        for key in tasks:
            visit(key)
        return [(k, tasks[k]) for k in order]

    def _parameter(self, spec: dict, inputs: dict, done: dict, state: str) -> Any:
        if "componentInputParameter" in spec:
            return inputs[spec["componentInputParameter"]]
        if "taskOutputParameter" in spec:
            out = spec["taskOutputParameter"]
            return done[out["producerTask"]].parameters[out["outputParameterKey"]]
        if "taskFinalStatus" in spec:  # resolve.go: the producer's MLMD execution state
            return {
                "state": state,
                "pipelineTaskName": spec["taskFinalStatus"]["producerTask"],
                "pipelineJobResourceName": f"run-{self.job_id}",
                "error": {},
            }
        constant = spec["runtimeValue"]["constant"]
        placeholders = {
            "{{$.pipeline_job_uuid}}": self.job_id,
            "{{$.pipeline_job_name}}": self.job_name,
        }
        return placeholders.get(constant, constant) if isinstance(constant, str) else constant

    def _execute(
        self, key: str, task: dict, inputs: dict, done: dict, state: str, retry: set[str]
    ) -> TaskRun:
        name = task["taskInfo"]["name"]
        component = self.spec["components"][task["componentRef"]["name"]]
        executor = self.spec["deploymentSpec"]["executors"][component["executorLabel"]]
        params = {
            n: self._parameter(s, inputs, done, state)
            for n, s in task["inputs"].get("parameters", {}).items()
        }
        artifacts = {}
        for n, s in task["inputs"].get("artifacts", {}).items():
            producer = s["taskOutputArtifact"]
            consumed = done[producer["producerTask"]].artifacts[producer["outputArtifactKey"]]
            artifacts[n] = {"artifacts": [consumed]}
        salt = uuid.uuid4().hex[:8]
        task_root = f"{self.root}/{self.spec['pipelineInfo']['name']}/{self.job_id}/{name}/{salt}"
        outputs = component.get("outputDefinitions", {})
        out_artifacts = {
            n: {"name": n, "uri": f"{task_root}/{n}", "type": s["artifactType"], "metadata": {}}
            for n, s in outputs.get("artifacts", {}).items()
        }
        executor_input = {
            "inputs": {"parameterValues": params, "artifacts": artifacts},
            "outputs": {
                "parameters": {n: {"outputFile": ""} for n in outputs.get("parameters", {})},
                "artifacts": {n: {"artifacts": [a]} for n, a in out_artifacts.items()},
                "outputFile": f"{task_root}/output_metadata.json",
            },
        }
        timeout = float(
            self.k8s.get(component["executorLabel"], {}).get("activeDeadlineSeconds", 0)
        )
        run = self._attempts(name, task.get("retryPolicy"), executor, executor_input, timeout)
        if name in retry and run.returncode == 0:  # the pod again: same input, fresh disk
            run = self._launch(name, executor["container"], executor_input)
            run.tries = 2
        return run

    def _attempts(
        self, name: str, retry: dict | None, executor: dict, executor_input: dict, timeout: float
    ) -> TaskRun:
        """The task's pods until one succeeds or Argo gives up; a failed pod took `timeout`."""
        attempts: list[Attempt] = []
        deadline = timeout
        while True:
            crash = {"HARNESS_CRASH_AFTER": self.fail.pop(name)} if name in self.fail else {}
            started, wall = self.clock, time.monotonic()
            run = self._launch(name, executor["container"], executor_input, crash)
            self.clock += deadline if run.returncode else time.monotonic() - wall
            attempts.append(Attempt(started, self.clock, bool(run.returncode), deadline, run.log))
            after = next_attempt(retry, attempts, timeout, self.policy)
            if isinstance(after, str):
                run.tries, run.attempts = len(attempts), attempts
                return run
            self.clock, deadline = after

    # -- the launcher -----------------------------------------------------------------------
    def _launch(
        self, name: str, container: dict, template: dict, fault: dict[str, str] | None = None
    ) -> TaskRun:
        """One pod: a fresh disk, inputs downloaded, the command, outputs uploaded (`fault`:
        HARNESS_CRASH_AFTER for an injected crash)."""
        self._pods += 1
        self.mount = self.workdir / f"pod-{self._pods}"
        executor_input = json.loads(json.dumps(template))
        outputs = executor_input["outputs"]
        outputs["outputFile"] = str(self._local(outputs["outputFile"]))
        for n, spec in outputs["parameters"].items():
            spec["outputFile"] = str(self.mount / "tmp" / "kfp" / "outputs" / n)
        for entry in executor_input["inputs"]["artifacts"].values():
            for artifact in entry["artifacts"]:
                self._download(artifact["uri"])
        for entry in outputs["artifacts"].values():
            self._local(entry["artifacts"][0]["uri"]).parent.mkdir(parents=True, exist_ok=True)
        for spec in outputs["parameters"].values():
            Path(spec["outputFile"]).parent.mkdir(parents=True, exist_ok=True)
        Path(outputs["outputFile"]).parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps(_protojson(executor_input))
        command = [*container["command"], *(a.replace("{{$}}", text) for a in container["args"])]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "MLFLOW_"))}
        env |= self.env | {e["name"]: e["value"] for e in container.get("env", [])}
        env |= {
            "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
            "PYTHONPATH": str(self.workdir / "site"),
            "HARNESS_S3_MOUNT": str(self.mount / "s3") + "/",
            "MLFLOW_RUN_ID": self._plugin_run(name),
            **(fault or {}),
        }
        returncode, log = self.start(command, env)
        run = TaskRun(name, returncode, executor_input=executor_input, log=log)
        if returncode:
            return run
        out_file = Path(executor_input["outputs"]["outputFile"])
        output = json.loads(out_file.read_text()) if out_file.exists() else {}
        run.parameters = output.get("parameterValues", {})
        for n, spec in executor_input["outputs"]["parameters"].items():
            if n not in run.parameters:  # collectOutputParameters: read the file
                run.parameters[n] = Path(spec["outputFile"]).read_text()
        written = output.get("artifacts", {})
        for n, entry in executor_input["outputs"]["artifacts"].items():
            artifact = entry["artifacts"][0]
            self._upload(artifact["uri"])
            metadata = (written.get(n, {}).get("artifacts") or [{}])[0].get("metadata", {})
            run.artifacts[n] = self._mlmd(artifact, metadata, n)
        return run

    def _mlmd(self, artifact: dict, metadata: dict, output_name: str) -> dict:
        """The artifact as a consumer's driver reads it back from MLMD (toRuntimeArtifact)."""
        self._ids += 1
        props: dict[str, Any] = {}
        for k, v in metadata.items():  # StructValueToMLMDValue, then back
            if isinstance(v, bool | int | float):
                props[k] = float(v)
            else:
                props[k] = (
                    {"list": v}
                    if isinstance(v, list)
                    else {"struct": v}
                    if isinstance(v, dict)
                    else v
                )
        props.setdefault("display_name", output_name)
        props.setdefault("store_session_info", json.dumps(SESSION_INFO))
        return {**artifact, "name": str(self._ids), "metadata": props}

    def _plugin_run(self, task_name: str) -> str:
        """A nested MLflow run for the task, as KFP 2.17's MLflow plugin injects."""
        from sparring.tracking import TrackingConfig, connect

        client = connect(TrackingConfig(tracking_uri=self.env["MLFLOW_TRACKING_URI"]))
        experiment = client.get_experiment_by_name("kfp-plugin") or client.get_experiment(
            client.create_experiment("kfp-plugin")
        )
        tags = {"kfp.task": task_name, "kfp.run_id": self.job_id}
        return client.create_run(experiment.experiment_id, tags=tags).info.run_id

    def _local(self, uri: str) -> Path:
        """LocalPathForURI: s3://bucket/key -> <mount>/s3/bucket/key."""
        return self.mount / "s3" / uri.removeprefix("s3://")

    def _download(self, uri: str) -> None:
        parsed = urlparse(uri)
        key, local = parsed.path.lstrip("/"), self._local(uri)
        pages = self.s3.get_paginator("list_objects_v2").paginate(Bucket=parsed.netloc, Prefix=key)
        for obj in (o for page in pages for o in page.get("Contents", [])):
            rest = obj["Key"][len(key) :].lstrip("/")
            target = local / rest if rest else local
            target.parent.mkdir(parents=True, exist_ok=True)
            self.s3.download_file(parsed.netloc, obj["Key"], str(target))

    def _upload(self, uri: str) -> None:
        parsed, local = urlparse(uri), self._local(uri)
        key = parsed.path.lstrip("/")
        files = [local] if local.is_file() else [p for p in local.rglob("*") if p.is_file()]
        for path in files:
            rel = path.relative_to(local).as_posix() if path != local else ""
            self.s3.upload_file(str(path), parsed.netloc, f"{key}/{rel}" if rel else key)


def _protojson(value: Any) -> Any:
    """`value` as protojson writes a google.protobuf.Value: numbers are doubles, and a whole
    one is written without a fraction (4.0 -> 4)."""
    if isinstance(value, dict):
        return {k: _protojson(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_protojson(v) for v in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value
