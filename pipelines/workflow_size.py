"""How many iterations one KFP run can hold: the Argo Workflow's size, estimated from the IR.

    .venv/bin/python -m sparring.pipelines.workflow_size configs/pipeline-gpu.yaml configs/pipeline.yaml

The loop is unrolled at compile time, so every iteration adds tasks to the compiled pipeline (the
IR) and, on a KFP cluster, to the Argo `Workflow` object the API server creates from it. Two
limits bound that object:

- **A run fails** (`LIMIT`, 1 MiB): above its `maxWorkflowSize` Argo's workflow controller
  gzips `status.nodes` into `status.compressedNodes`, and fails the run ("workflow is longer
  than maximum allowed size") when the object is still over it, unless node-status offloading
  to a database is on. `max_iterations` keeps the stored object (compressed where Argo would
  compress it) under 90% of this: the cap, above which `sparring submit` splits a run.
- **A run can't be retried from the KFP UI** (`RETRY_LIMIT`, 1.5 MiB): a retry writes the whole
  uncompressed Workflow back, which etcd refuses past its default `--max-request-bytes`
  (kubeflow/pipelines#13738). `retryable_iterations` keeps the uncompressed object under 90%
  of this; `sparring submit` warns past it (`--block` keeps each run retryable).

The estimate (read from kubeflow/pipelines 2.16.0 and 2.17.0, backend/src/v2/compiler/
argocompiler and backend/src/v2/driver, and Argo's workflow/controller/operator.go):

1. **Spec.** `spec.arguments.parameters` holds each component spec and each executor container
   as compact JSON, once per distinct container (keyed by its sha256), each DAG component's
   spec (`components-root`, `components-comp-exit-handler-1`: every task of the DAG), and one
   `kubernetes-<component>` per component with a Kubernetes config. Each task's spec JSON is
   inlined again into its driver task's arguments, next to fixed system templates.
2. **Status.** Argo stores every node's resolved inputs (`initializeExecutableNode`) and a
   pod's outputs. Per container task: the driver pod (inputs: component, task and container
   JSON, Kubernetes config; output: the pod-spec patch), the executor DAG node, and with
   retries a Retry node, each holding the pod-spec patch again, then one pod per attempt
   (the estimate counts one). The patch is the launcher's command line: the executor input
   (every input value, so the whole config JSON a task gets from `start`, and the artifact
   URIs), the component JSON, the user's command and args, env, resources and the Kubernetes
   config. A DAG's driver node holds its component's JSON; the root's, all run parameters.
3. Values nest as JSON strings inside JSON strings, so each level escapes the quotes again;
   the estimate builds these documents and measures `json.dumps` of the whole object.

4. **Compression.** Argo's compressed form is the status nodes' JSON, gzipped and base64'd; the
   estimate does the same. gzip's 32 KB window finds the repeats within a task's nodes, not
   across tasks, so the compressed object still grows with every iteration.

`measure()` compiles the config at 1 and 2 iterations with the real KFP compiler (seconds),
estimates both Workflows, and takes the differences as the per-iteration growth (of the whole
and of the compressed object). The 10% margin covers what the estimate leaves out: retried
attempts (one more pod node with its patch each, about 17 KB uncompressed for
configs/pipeline-gpu.yaml), Argo's per-node messages and log artifacts, fields KFP adds
between releases.
Where the Workflow's bytes go, the growth and the caps of the shipped configs:
docs/results.md#compiled-ir-size.
"""

from __future__ import annotations

import base64
import functools
import gzip
import hashlib
import itertools
import json
import math
import sys
import tempfile
import warnings
from pathlib import Path
from typing import NamedTuple

import yaml
from sparring.pipelines.selfplay import compile_pipeline

from sparring.loop.config import PipelineConfig

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml: 100x faster on the IR
LIMIT = 1024 * 1024  # bytes: Argo's maxWorkflowSize (status.nodes compressed above it)
RETRY_LIMIT = 1_572_864  # bytes: etcd's default --max-request-bytes (a retry from the KFP UI)
MARGIN = 0.10  # fraction of LIMIT kept free for what the estimate leaves out
WORKFLOW = "sparring-selfplay-x7k2q"  # a generated Workflow name (generateName + 5 chars)
UID = "0b9e4f7c-3d1a-4c55-9a8e-2f6d1b7c8e90"  # a run / execution uuid
TIME = "2026-11-26T10:00:00Z"
SMALL_VALUE = "x" * 64  # an unknown task output parameter's value (ids, names)
RETRY_PARAMS = ("retry-max-count", "retry-backoff-duration", "retry-backoff-factor",
                "retry-backoff-max-duration")  # fmt: skip


class Growth(NamedTuple):
    """Bytes of the compiled IR and of the estimated Workflow (whole, and as Argo stores it with
    its status compressed) at 1 iteration, and per added iteration."""

    ir_base: int  # IR YAML bytes at 1 iteration
    ir_per_iteration: int  # IR growth per added iteration
    workflow_base: int  # estimated Workflow JSON bytes at 1 iteration
    workflow_per_iteration: int  # estimated Workflow growth per added iteration
    compressed_base: int  # the same Workflow with status.nodes gzipped, at 1 iteration
    compressed_per_iteration: int  # its growth per added iteration

    def workflow_bytes(self, iterations: int) -> int:
        """The estimated Workflow of a run of `iterations`, uncompressed."""
        return self.workflow_base + (iterations - 1) * self.workflow_per_iteration

    def stored_bytes(self, iterations: int, limit: int = LIMIT) -> int:
        """The object Argo stores: compressed when the whole is over `limit`."""
        whole = self.workflow_bytes(iterations)
        if whole <= limit:
            return whole
        return self.compressed_base + (iterations - 1) * self.compressed_per_iteration

    def cap(self, limit: int = LIMIT, margin: float = MARGIN) -> int:
        """The most iterations whose stored Workflow stays within (1 - margin) x limit (a run
        past it fails); 0 if none."""
        return _most(self.compressed_base, self.compressed_per_iteration, limit * (1 - margin))

    def retryable(self, limit: int = RETRY_LIMIT, margin: float = MARGIN) -> int:
        """The most iterations whose whole Workflow stays within (1 - margin) x limit (a run
        past it can't be retried from the KFP UI); 0 if none."""
        return _most(self.workflow_base, self.workflow_per_iteration, limit * (1 - margin))


def _most(base: int, per_iteration: int, budget: float) -> int:
    """The most n >= 1 with base + (n - 1) x per_iteration <= budget; 0 if not even one."""
    if base > budget:
        return 0
    return 1 + math.floor((budget - base) / per_iteration)


def _dumps(obj) -> str:
    """Compact JSON, as Go's encoding/json and protojson write it."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


_IDS = itertools.count(1_000_000_000)  # node ids: the Workflow's name and 10 digits


def _node(name: str, template: str, kind: str, inputs: dict, outputs: dict | None = None) -> dict:
    """One Argo NodeStatus (status.nodes[id]) with its resolved input and output parameters."""
    node = {
        "id": f"{WORKFLOW}-{next(_IDS):010d}",
        "name": f"{WORKFLOW}.{name}",
        "displayName": name.rsplit(".", 1)[-1],
        "type": kind,
        "templateName": template,
        "templateScope": f"local/{WORKFLOW}",
        "phase": "Succeeded",
        "boundaryID": f"{WORKFLOW}-0123456789",
        "startedAt": TIME,
        "finishedAt": TIME,
        "progress": "1/1",
        "resourcesDuration": {"cpu": 1234, "memory": 56789},
        "inputs": {"parameters": [{"name": k, "value": v} for k, v in inputs.items()]},
        "children": [f"{WORKFLOW}-0123456789"],
    }
    if kind == "Pod":
        node["hostNodeName"] = "ip-10-0-123-45.eu-west-1.compute.internal"
    if outputs is not None:
        node["outputs"] = {"parameters": [{"name": k, "value": v} for k, v in outputs.items()]}
        node["outputs"]["exitCode"] = "0"
    return node


def _dag_tasks(name: str, ref: str, task_json: str) -> list[dict]:
    """A task's two DAG tasks in its parent's template: the driver (its task spec inlined, the
    component, container and Kubernetes config as `{{workflow.parameters.…}}` references) and
    the executor."""
    ref_param = "{{workflow.parameters.components-" + "0" * 64 + "}}"
    driver_args = {
        "component": ref_param,
        "task": task_json,
        "container": ref_param.replace("components", "implementations"),
        "task-name": name,
        "parent-dag-id": "{{inputs.parameters.parent-dag-id}}",
        "kubernetes-config": "{{workflow.parameters.kubernetes-" + ref + "}}",
    }
    output = "{{tasks." + name + "-driver.outputs.parameters."
    executor_args = {
        "pod-spec-patch": output + "pod-spec-patch}}",
        "cached-decision": output + "cached-decision}}",
        **{k: "2" for k in RETRY_PARAMS},
    }
    return [
        {
            "name": f"{name}-driver",
            "template": "system-container-driver",
            "depends": "start.Succeeded && game-init.Succeeded",
            "arguments": {"parameters": [{"name": k, "value": v} for k, v in driver_args.items()]},
        },
        {
            "name": name,
            "template": "retry-system-container-executor",
            "depends": f"{name}-driver.Succeeded",
            "arguments": {
                "parameters": [{"name": k, "value": v} for k, v in executor_args.items()]
            },
        },
    ]


def _parameter_value(spec: dict, root_defaults: dict[str, str]) -> str:
    """A task input parameter's runtime value as the executor input carries it."""
    if "runtimeValue" in spec:
        return _dumps(spec["runtimeValue"].get("constant", ""))
    if "componentInputParameter" in spec:
        name = spec["componentInputParameter"].removeprefix("pipelinechannel--")
        return root_defaults.get(name, SMALL_VALUE)
    if "taskOutputParameter" in spec:  # `start` passes the whole config on as `run_config`
        key = spec["taskOutputParameter"].get("outputParameterKey", "")
        return root_defaults.get("config", SMALL_VALUE) if key == "run_config" else SMALL_VALUE
    return SMALL_VALUE


def _executor_input(name: str, task: dict, component: dict, root_defaults: dict) -> dict:
    """The executor input the driver writes for a task (inputs.parameterValues, artifact URIs)."""
    uri = f"s3://mlpipeline/v2/artifacts/{WORKFLOW}/{UID}/{name}/{UID}"
    params = task.get("inputs", {}).get("parameters", {})
    artifacts = component.get("inputDefinitions", {}).get("artifacts", {})
    outputs = component.get("outputDefinitions", {})
    artifact = {"name": f"projects/{UID}/artifacts/12345", "metadata": {}}

    def artifacts_of(defs: dict) -> dict:
        return {
            k: {"artifacts": [{**artifact, "type": v.get("artifactType", {}), "uri": f"{uri}/{k}"}]}
            for k, v in defs.items()
        }

    return {
        "inputs": {
            "parameterValues": {k: _parameter_value(v, root_defaults) for k, v in params.items()},
            "artifacts": artifacts_of(artifacts),
        },
        "outputs": {
            "parameters": {
                k: {"outputFile": f"/tmp/kfp/outputs/{k}"} for k in outputs.get("parameters", {})
            },
            "artifacts": artifacts_of(outputs.get("artifacts", {})),
            "outputFile": "/tmp/kfp_outputs/output_metadata.json",
        },
    }


def _pod_spec_patch(name, task, component, container, k8s, root_defaults) -> str:
    """The driver's pod-spec patch: the launcher's command line over the user's, plus the pod's
    env, resources and (as its own JSON, about the size of what the driver derives) the
    Kubernetes config."""
    executor_input = _executor_input(name, task, component, root_defaults)
    command = [
        "/kfp-launcher/launch",
        *("--pipeline_name", WORKFLOW, "--run_id", UID, "--execution_id", "123456"),
        *("--executor_input", _dumps(executor_input), "--component_spec", _dumps(component)),
        *("--pod_name", "$(KFP_POD_NAME)", "--pod_uid", "$(KFP_POD_UID)"),
        *("--ml_pipeline_server_address", "ml-pipeline.kubeflow", "--ml_pipeline_server_port"),
        *("8887", "--mlmd_server_address", "metadata-grpc-service.kubeflow"),
        *("--mlmd_server_port", "8080", "--publish_logs", "false", "--"),
        *container.get("command", []),
        *container.get("args", []),
    ]
    main = {
        "name": "main",
        "image": container.get("image", ""),
        "command": command,
        "env": container.get("env", []),
        "resources": container.get("resources", {}),
    }
    return _dumps({"containers": [main], "kubernetes": k8s})


def estimate_workflow_bytes(package: str | Path) -> int:
    """Bytes of the Argo Workflow (JSON, spec and the status of a finished run) that KFP's v2
    backend makes of the compiled pipeline `package`, by the model in the module docstring."""
    return len(_dumps(_workflow(package)).encode())


def compressed_workflow_bytes(package: str | Path) -> int:
    """Bytes of the same Workflow with `status.nodes` moved into `status.compressedNodes`
    (gzip, then base64), as Argo stores an object over its size limit."""
    workflow = _workflow(package)
    nodes = workflow["status"].pop("nodes")
    packed = base64.b64encode(gzip.compress(_dumps(nodes).encode()))
    workflow["status"]["compressedNodes"] = packed.decode()
    return len(_dumps(workflow).encode())


def _workflow(package: str | Path) -> dict:
    """The estimated Workflow object of the compiled pipeline `package`, as a dict."""
    docs = list(yaml.load_all(Path(package).read_text(), Loader=_LOADER))
    ir = docs[0]
    platform = docs[1] if len(docs) > 1 else {}
    k8s_execs = platform.get("platforms", {}).get("kubernetes", {})
    k8s_execs = k8s_execs.get("deploymentSpec", {}).get("executors", {})
    executors = ir.get("deploymentSpec", {}).get("executors", {})
    components = {**ir.get("components", {}), "root": ir["root"]}
    root_params = ir["root"].get("inputDefinitions", {}).get("parameters", {})
    root_defaults = {
        k: v["defaultValue"] if isinstance(v.get("defaultValue"), str) else _dumps(v.get("defaultValue"))
        for k, v in root_params.items()
    }  # fmt: skip

    arguments: dict[str, str] = {}  # spec.arguments.parameters
    templates: list = []  # the DAG templates' tasks (fixed system templates: SYSTEM_TEMPLATES)
    nodes: dict[str, dict] = {}

    def add(node: dict) -> None:
        nodes[node["id"]] = node

    def visit(dag_name: str, path: str) -> None:
        for name, task in components[dag_name]["dag"]["tasks"].items():
            ref = task["componentRef"]["name"]
            component = components[ref]
            task_json = _dumps(task)
            here = f"{path}.{name}"
            templates.extend(_dag_tasks(name, ref, task_json))
            if "dag" in component:
                arguments.setdefault(f"components-{ref}", _dumps(component))
                add(_node(f"{here}-driver", "system-dag-driver", "Pod",
                          {"component": arguments[f"components-{ref}"], "task": task_json,
                           "parent-dag-id": "123456"},
                          {"execution-id": "123457", "iteration-count": "0", "condition": "true"}))  # fmt: skip
                add(_node(here, ref, "DAG", {"parent-dag-id": "123457", "condition": ""}))
                visit(ref, here)
                continue
            container = executors[component["executorLabel"]]["container"]
            k8s = k8s_execs.get(component["executorLabel"])
            key = hashlib.sha256(_dumps(container).encode()).hexdigest()
            arguments.setdefault(f"components-{key}", _dumps(component))
            arguments.setdefault(f"implementations-{key}", _dumps(container))
            if k8s is not None:
                arguments[f"kubernetes-{ref}"] = _dumps(k8s)
            patch = _pod_spec_patch(name, task, component, container, k8s or {}, root_defaults)
            retries = {k: "2" for k in RETRY_PARAMS} if "retryPolicy" in task else {}
            driver_inputs = {
                "component": arguments[f"components-{key}"],
                "task": task_json,
                "container": arguments[f"implementations-{key}"],
                "task-name": name,
                "parent-dag-id": "123457",
                "iteration-index": "-1",
                "kubernetes-config": _dumps(k8s) if k8s is not None else "",
            }
            add(_node(f"{here}-driver", "system-container-driver", "Pod", driver_inputs,
                      {"pod-spec-patch": patch, "cached-decision": "false", "condition": "true"}))  # fmt: skip
            executor_inputs = {"pod-spec-patch": patch, "cached-decision": "false", **retries}
            add(_node(here, "system-container-executor", "DAG", executor_inputs))
            impl_inputs = {"pod-spec-patch": patch, **retries}
            if retries:
                add(_node(f"{here}.executor", "retry-system-container-impl", "Retry", impl_inputs))
            add(_node(f"{here}.executor(0)", "system-container-impl", "Pod", impl_inputs, {}))

    arguments["components-root"] = _dumps(ir["root"])
    runtime = {"parameters": {k: {"stringValue": v} for k, v in root_defaults.items()}}
    add(_node("entrypoint", "entrypoint", "DAG", {}))
    add(_node("root-driver", "system-dag-driver", "Pod",
              {"component": arguments["components-root"], "runtime-config": _dumps(runtime),
               "driver-type": "ROOT_DAG", "parent-dag-id": "0", "iteration-index": "-1"},
              {"execution-id": "123456", "iteration-count": "0", "condition": "true"}))  # fmt: skip
    add(_node("root", "root", "DAG", {"parent-dag-id": "123456", "condition": ""}))
    visit("root", "root")

    workflow = {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Workflow",
        "metadata": {"name": WORKFLOW, "namespace": "kubeflow", "uid": UID},
        "spec": {
            "arguments": {"parameters": [{"name": k, "value": v} for k, v in arguments.items()]},
            "dagTasks": templates,
            "systemTemplates": "s" * SYSTEM_TEMPLATES,
        },
        "status": {"phase": "Succeeded", "startedAt": TIME, "finishedAt": TIME, "nodes": nodes},
    }
    return workflow


# Bytes of the fixed part of a KFP v2 Workflow: its driver, executor and launcher templates,
# volumes, pod metadata, security context and managed-fields metadata (compiled hello_world,
# testdata of kubeflow/pipelines 2.17: ~9 KB), with room for the DAG tasks' fixed fields.
SYSTEM_TEMPLATES = 12_000


def measure(cfg: PipelineConfig) -> Growth:
    """Compile `cfg` at 1 and 2 iterations (real KFP compiler) and estimate both Workflows;
    remembered per config within a process."""
    return _measure(cfg.model_dump_json())


@functools.cache
def _measure(cfg_json: str) -> Growth:
    cfg = PipelineConfig.model_validate_json(cfg_json)
    sizes = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in (1, 2):
            part = cfg.model_copy(update={"iterations": n})
            package = compile_pipeline(part, str(Path(tmp) / f"pipeline-{n}.yaml"))
            sizes.append(
                (
                    Path(package).stat().st_size,
                    estimate_workflow_bytes(package),
                    compressed_workflow_bytes(package),
                )
            )
    (ir1, wf1, c1), (ir2, wf2, c2) = sizes
    return Growth(ir1, ir2 - ir1, wf1, wf2 - wf1, c1, c2 - c1)


def max_iterations(cfg: PipelineConfig, limit: int = LIMIT, margin: float = MARGIN) -> int:
    """The most iterations one run of `cfg` may hold (see the module docstring): at least 1,
    with a warning when even one iteration's Workflow is estimated over the budget."""
    growth = measure(cfg)
    cap = growth.cap(limit, margin)
    if cap < 1:
        warnings.warn(
            f"{cfg.name}: one iteration's Argo Workflow is estimated at "
            f"{growth.stored_bytes(1, limit):,} bytes as stored, over {1 - margin:.0%} of "
            f"{limit:,}; runs of one iteration each may still fail (a shorter config, or fewer "
            "retries, shrinks every task's pod-spec patch)",
            stacklevel=2,
        )
    return max(cap, 1)


def retryable_iterations(cfg: PipelineConfig) -> int:
    """The most iterations a run of `cfg` may hold and still be retried from the KFP UI (at
    least 1; see the module docstring)."""
    return max(measure(cfg).retryable(), 1)


def main(paths: list[str]) -> None:
    """Print the IR and Workflow growth and the cap of each config."""
    for path in paths:
        cfg = PipelineConfig.model_validate(yaml.safe_load(Path(path).read_text()))
        g = measure(cfg)
        print(
            f"{path}: IR {g.ir_base:,} B + {g.ir_per_iteration:,} B/iteration; Workflow "
            f"{g.workflow_base:,} B + {g.workflow_per_iteration:,} B/iteration, compressed "
            f"{g.compressed_base:,} B + {g.compressed_per_iteration:,} B/iteration; cap "
            f"{g.cap()} iterations per run, retryable from the UI up to {g.retryable()}"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
