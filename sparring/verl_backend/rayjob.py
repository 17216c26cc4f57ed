"""verl on several nodes: one KubeRay RayJob per iteration (verl.nnodes > 1).

    manifest = rayjob_manifest(name, namespace, entrypoint, env, image, verl_cfg, k8s)
    status = run_rayjob(api_client(), manifest, verl_cfg.rayjob)   # create, wait, stream, delete

The RayJob (KubeRay `ray.io/v1`, written against KubeRay v1.4.2's API) starts a Ray cluster of
one head pod (verl's driver, no GPU) and one worker group of `nnodes` pods with
`n_gpus_per_node` GPUs each, all on the runtime image with the shared volume mounted, and
submits the entrypoint (`python -m verl.trainer.main_ppo ...` with paths on that volume) from
KubeRay's submitter Job. `run_rayjob`:
  1. creates the RayJob;
  2. polls its status every `poll_seconds` and prints the submitter pod's new log lines (the
     submitter runs `ray job submit`, which follows the driver's output);
  3. returns the final status when the job SUCCEEDED; raises RayJobError with the last
     `log_tail` lines when it failed, was stopped, or outlived `timeout_seconds`;
  4. deletes the RayJob (and with it the Ray cluster and its GPUs), unless it failed and
     `keep_failed` is set.
A RayJob of the same name left by an earlier attempt of the task is deleted before the create.
Each poll reads the submitter's whole log and prints the lines it has not printed yet.

The API calls it makes are exactly the chart's `rayJobs` RBAC rules: rayjobs create/get/delete,
pods list, pods/log get (tests/verl_backend/test_rayjob.py checks both against each other).

Every pod (head, workers and the submitter, whose template is ours so that it gets the pull
secrets) meets the `restricted` Pod Security Standard, starts without an Istio sidecar (a
sidecar would keep the submitter Job from ever completing in a sidecar-injected Kubeflow profile
namespace) and carries RAY_POD_LABELS, which the chart's `<release>-ray` NetworkPolicy selects:
only Ray pods and the KubeRay operator reach them, so the unauthenticated dashboard stays closed.
"""

from __future__ import annotations

import hashlib
import re
import shlex
import sys
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

import yaml

from sparring.verl_backend.config import RayJobSettings, VerlConfig

KUBERAY_API = "KubeRay v1.4.2, ray.io/v1"
"""The KubeRay release whose documented RayJob API the manifest follows."""
GROUP, VERSION, PLURAL = "ray.io", "v1", "rayjobs"
RAY_VERSION = "2.60.0"  # the runtime image's ray (images/requirements-gpu.lock)
SHARED_VOLUME = "shared"
RAY_POD_LABELS = {
    "app.kubernetes.io/part-of": "sparring",
    "app.kubernetes.io/component": "verl-ray",
    "sidecar.istio.io/inject": "false",
}
"""Labels of every pod of the RayJob: the chart's NetworkPolicy selects them; no Istio sidecar."""
SUBMITTER_BACKOFF_LIMIT = 2
"""Retries of KubeRay's submitter Job (its own default): a transient failure of `ray job submit`
must not fail a healthy Ray job; a retry checks `ray job status` first, so it never submits
twice."""
SA_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


class RayJobError(RuntimeError):
    """The RayJob failed, was stopped or timed out (the message ends with its last lines)."""


def rayjob_name(run_name: str, iteration: int) -> str:
    """A DNS-1123 name, unique per run and iteration, short enough for the names KubeRay
    derives from it (RayCluster, head Service: at most 63 characters)."""
    digest = hashlib.sha1(run_name.encode()).hexdigest()[:6]
    slug = re.sub(r"[^a-z0-9-]+", "-", run_name.lower()).strip("-")[:20].strip("-")
    return f"sparring-verl-{slug}-{digest}-{iteration}".replace("--", "-")


def _pod_template(
    container: dict[str, Any], k8s: Any, volumes: list[dict[str, Any]]
) -> dict[str, Any]:
    """A pod of the RayJob: RAY_POD_LABELS, `restricted`-compatible (non-root, no privilege
    escalation, no capabilities, the runtime's seccomp profile), the pull secrets, and `fsGroup`
    so that the shared volume is writable by the pods' group."""
    container["securityContext"] = {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    }
    spec: dict[str, Any] = {
        "containers": [container],
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": k8s.run_as_user,
            "runAsGroup": k8s.run_as_group,
            "fsGroup": k8s.run_as_group,
            "fsGroupChangePolicy": "OnRootMismatch",  # no recursive chown of the volume per pod
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }
    if volumes:
        spec["volumes"] = volumes
    if k8s.image_pull_secrets:
        spec["imagePullSecrets"] = [{"name": s} for s in k8s.image_pull_secrets]
    return {"metadata": {"labels": dict(RAY_POD_LABELS)}, "spec": spec}


def _ray_pod(image: str, resources: dict[str, Any], k8s: Any, shared: str) -> dict[str, Any]:
    """A Ray node: the runtime image, the shared volume and a RAM-backed /dev/shm."""
    container = {
        "name": "ray",
        "image": image,
        "resources": resources,
        "volumeMounts": [
            {"name": SHARED_VOLUME, "mountPath": shared},
            {"name": "dshm", "mountPath": "/dev/shm"},
        ],
    }
    return _pod_template(container, k8s, [{"name": "dshm", "emptyDir": {"medium": "Memory"}}])


def _submitter_pod(image: str, k8s: Any) -> dict[str, Any]:
    """KubeRay's default submitter (its name, image and resources) with our pod settings;
    KubeRay fills in the command (`ray job submit ...`) since the container sets none."""
    container = {
        "name": "ray-job-submitter",
        "image": image,
        "resources": {
            "requests": {"cpu": "500m", "memory": "200Mi"},
            "limits": {"cpu": "1", "memory": "1Gi"},
        },
    }
    pod = _pod_template(container, k8s, [])
    pod["spec"]["restartPolicy"] = "Never"
    return pod


def rayjob_manifest(
    name: str,
    namespace: str,
    entrypoint: list[str],
    env: dict[str, str],
    image: str,
    cfg: VerlConfig,
    k8s: Any,
) -> dict[str, Any]:
    """The RayJob for one verl run (see the module docstring). `k8s` is the pipeline's
    KubernetesSettings: node selector, tolerations and accelerator name for the GPU workers,
    the non-root uid/gid, image pull secrets (every pod's, the submitter's included)."""
    r = cfg.rayjob
    claim = {"name": SHARED_VOLUME, "persistentVolumeClaim": {"claimName": r.shared_pvc}}
    cpu_only = {"cpu": r.head_cpu, "memory": r.head_memory}
    head = _ray_pod(image, {"requests": cpu_only, "limits": cpu_only}, k8s, r.shared_path)
    gpus = {k8s.accelerator_type: str(cfg.n_gpus_per_node)}
    worker_res = {"cpu": r.worker_cpu, "memory": r.worker_memory}
    worker = _ray_pod(
        image,
        {"requests": worker_res, "limits": {**worker_res, **gpus}},
        k8s,
        r.shared_path,
    )
    for pod in (head, worker):
        pod["spec"]["volumes"].append(claim)
    if k8s.node_selector:
        worker["spec"]["nodeSelector"] = dict(k8s.node_selector)
    if k8s.tolerations:
        worker["spec"]["tolerations"] = [t.model_dump(exclude_none=True) for t in k8s.tolerations]
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "RayJob",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/part-of": "sparring"},
        },
        "spec": {
            "entrypoint": shlex.join(entrypoint),
            "runtimeEnvYAML": yaml.safe_dump({"env_vars": env}, sort_keys=True),
            "submissionMode": "K8sJobMode",
            "shutdownAfterJobFinishes": not r.keep_failed,
            "ttlSecondsAfterFinished": 0,
            "activeDeadlineSeconds": r.timeout_seconds,
            "backoffLimit": 0,  # a retry is the task's: a new cluster, the stage started afresh
            "submitterConfig": {"backoffLimit": SUBMITTER_BACKOFF_LIMIT},
            "submitterPodTemplate": _submitter_pod(image, k8s),
            "rayClusterSpec": {
                "rayVersion": RAY_VERSION,
                "headGroupSpec": {
                    "rayStartParams": {"num-gpus": "0", "dashboard-host": "0.0.0.0"},
                    "template": head,
                },
                "workerGroupSpecs": [
                    {
                        "groupName": "gpu",
                        "replicas": cfg.nnodes,
                        "minReplicas": cfg.nnodes,
                        "maxReplicas": cfg.nnodes,
                        "rayStartParams": {"num-gpus": str(cfg.n_gpus_per_node)},
                        "template": worker,
                    }
                ],
            },
        },
    }


def api_client() -> Any:
    """A `kubernetes` ApiClient: in-cluster (the task pod's ServiceAccount), else ~/.kube/config."""
    from kubernetes import client, config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    return client.ApiClient()


def own_namespace(settings: RayJobSettings) -> str:
    """`settings.namespace`, else the pod's ServiceAccount namespace, else `default`."""
    if settings.namespace:
        return settings.namespace
    return SA_NAMESPACE.read_text().strip() if SA_NAMESPACE.exists() else "default"


class _LogFollower:
    """Prints the submitter pod's log lines that are new since the last poll."""

    def __init__(self, core: Any, namespace: str, job: str, out: TextIO, tail: int) -> None:
        self.core, self.namespace, self.job, self.out = core, namespace, job, out
        self.pod: str | None = None
        self.seen = 0
        self.last: deque[str] = deque(maxlen=tail)

    def poll(self) -> None:
        from kubernetes.client.exceptions import ApiException

        pods = self.core.list_namespaced_pod(self.namespace, label_selector=f"job-name={self.job}")
        if not pods.items:
            return
        newest = max(pods.items, key=lambda p: p.metadata.creation_timestamp)
        if newest.metadata.name != self.pod:  # the first pod, or a retry's new one
            self.pod, self.seen = newest.metadata.name, 0
        try:
            text = self.core.read_namespaced_pod_log(self.pod, self.namespace)
        except ApiException as e:
            if e.status in (400, 404):  # not started yet, or already gone
                return
            raise
        lines = text.splitlines()
        for line in lines[self.seen :]:
            self.out.write(line + "\n")
            self.last.append(line)
        self.out.flush()
        self.seen = len(lines)


def run_rayjob(
    client: Any,
    manifest: dict[str, Any],
    settings: RayJobSettings,
    out: TextIO = sys.stdout,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Any]:
    """Create the RayJob, follow it to its end, delete it; see the module docstring.
    `client` is a kubernetes ApiClient. Returns the RayJob's final `status`."""
    from kubernetes.client import CoreV1Api, CustomObjectsApi, V1DeleteOptions
    from kubernetes.client.exceptions import ApiException

    custom, core = CustomObjectsApi(client), CoreV1Api(client)
    namespace, name = manifest["metadata"]["namespace"], manifest["metadata"]["name"]
    where = (GROUP, VERSION, namespace, PLURAL)
    _create(custom, where, manifest, out, sleep)
    out.write(f"[sparring] created RayJob {namespace}/{name} ({manifest['spec']['entrypoint']})\n")
    logs = _LogFollower(core, namespace, name, out, settings.log_tail)
    deadline, succeeded = clock() + settings.timeout_seconds, False
    try:
        while True:
            status = custom.get_namespaced_custom_object(*where, name).get("status") or {}
            logs.poll()
            if status.get("jobDeploymentStatus") in ("Complete", "Failed"):
                break
            if clock() > deadline:
                raise RayJobError(_failure(name, status, "timed out", settings, logs))
            sleep(settings.poll_seconds)
        if status.get("jobStatus") != "SUCCEEDED":
            raise RayJobError(_failure(name, status, "failed", settings, logs))
        succeeded = True
        return status
    finally:
        if succeeded or not settings.keep_failed:
            try:
                custom.delete_namespaced_custom_object(
                    *where, name, body=V1DeleteOptions(propagation_policy="Background")
                )
                out.write(f"[sparring] deleted RayJob {namespace}/{name}\n")
            except ApiException as e:
                if e.status != 404:
                    raise


def _create(
    custom: Any, where: tuple, manifest: dict[str, Any], out: TextIO, sleep: Callable
) -> None:
    """Create the RayJob. One left by an earlier attempt of the same task (a retried pod) is
    deleted first, so that it stops writing to the stage this attempt starts afresh."""
    from kubernetes.client import V1DeleteOptions
    from kubernetes.client.exceptions import ApiException

    name = manifest["metadata"]["name"]
    for _ in range(60):
        try:
            custom.create_namespaced_custom_object(*where, manifest)
            return
        except ApiException as e:
            if e.status != 409:
                raise
        out.write(f"[sparring] RayJob {name} exists from an earlier attempt: deleting it\n")
        try:
            custom.delete_namespaced_custom_object(
                *where, name, body=V1DeleteOptions(propagation_policy="Foreground")
            )
        except ApiException as e:
            if e.status != 404:
                raise
        sleep(5.0)
    raise RayJobError(f"RayJob {name} from an earlier attempt was not deleted within 5 minutes")


def _failure(
    name: str, status: dict[str, Any], what: str, settings: RayJobSettings, logs: _LogFollower
) -> str:
    state = ", ".join(
        f"{k}={status[k]}"
        for k in ("jobDeploymentStatus", "jobStatus", "reason", "message")
        if status.get(k)
    )
    kept = (
        f"kept for debugging (kubectl delete rayjob {name} frees its GPUs)"
        if settings.keep_failed
        else "deleted"
    )
    return (
        f"RayJob {name} {what} ({state or 'no status'}; deadline {settings.timeout_seconds} s);"
        f" nothing was trained or registered; the RayJob was {kept}. Last "
        f"{len(logs.last)} lines of its submitter log:\n" + "\n".join(logs.last)
    )
