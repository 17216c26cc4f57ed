"""verl multi-node on KubeRay: the RayJob manifest against KubeRay v1.4.2's RayJob CRD schema,
strictly (pod templates against Kubernetes' own schema and the `restricted` Pod Security
Standard), the create/wait/stream/delete logic
and the whole verl task against a fake API server on localhost (tests/verl_backend/fake_kube.py),
and the chart's RBAC equal to the API calls the task makes."""

from __future__ import annotations

import contextlib
import io
import json
import re
import shlex
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import torch
import yaml
from fake_kube import FakeKube
from test_helm import CHART, MINIMAL, RELEASE, render, restricted_violations, validate_crd
from transformers import AutoModelForCausalLM

from sparring.loop import tasks, verl_task
from sparring.loop.config import PipelineConfig
from sparring.verl_backend import rayjob
from sparring.verl_backend.config import RayJobSettings

CRD = json.loads((Path(__file__).parent / "rayjob-v1.4.2.crd.json").read_text())
DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def pod_templates(m: dict) -> list[dict]:
    """The head's, the workers' and the submitter's pod templates."""
    cluster = m["spec"]["rayClusterSpec"]
    workers = [g["template"] for g in cluster["workerGroupSpecs"]]
    return [cluster["headGroupSpec"]["template"], *workers, m["spec"]["submitterPodTemplate"]]


def validate_rayjob(m: dict) -> None:
    """What the API server and KubeRay v1.4.2 check: the CRD schema (strict field validation),
    each pod template against Kubernetes' pod schema, and KubeRay's name rule
    (utils.ValidateRayJobMetadata: a DNS-1035 label of at most 47 characters)."""
    assert m["apiVersion"] == "ray.io/v1" and m["kind"] == "RayJob"
    validate_crd(m, CRD)
    for template in pod_templates(m):
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, **template}
        kubernetes_validate.validate(pod, "1.30", strict=True)
    name = m["metadata"]["name"]
    if len(name) > 47 or not DNS1035.match(name):
        raise ValueError(f"KubeRay refuses the RayJob name {name!r}")


RUNNING = {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING"}
DONE = {"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED"}
FAILED = {
    "jobDeploymentStatus": "Failed",
    "jobStatus": "FAILED",
    "reason": "AppFailed",
    "message": "Job entrypoint command failed with exit code 1",
}


def multinode_cfg(tmp_path, **rayjob_settings) -> PipelineConfig:
    return PipelineConfig.model_validate(
        {
            "game": {"params": {"k": 3, "max_turns": 4}},
            "train_backend": "verl",
            "games_per_iteration": 16,
            "game_init": {"num_train": 6, "num_val": 2},
            "verl": {
                "nnodes": 3,
                "n_gpus_per_node": 4,
                "rollout_n": 2,
                "train_batch_size": 8,
                "ppo_mini_batch_size": 8,
                "rayjob": {
                    "shared_pvc": "verl-shared",
                    "shared_path": str(tmp_path / "shared"),
                    "namespace": "team-a",
                    "poll_seconds": 0.01,
                    **rayjob_settings,
                },
            },
            "kubernetes": {
                "node_selector": {"gpu": "h100"},
                "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
                "image_pull_secrets": ["regcred"],
            },
            "storage": {"root": (tmp_path / "store").as_uri()},
            "tracking": {"tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}", "experiment": "v"},
        }
    )


def manifest_for(cfg: PipelineConfig, entrypoint: list[str] | None = None) -> dict:
    cmd = entrypoint or ["python", "-m", "verl.trainer.main_ppo", "trainer.nnodes=3"]
    env = {"VERL_FILE_LOGGER_PATH": "/mnt/x/metrics.jsonl"}
    name = rayjob.rayjob_name("Selfplay Run_2026-11-23 17:00", 7)
    return rayjob.rayjob_manifest(
        name, "team-a", cmd, env, "ghcr.io/x/sparring:1-gpu", cfg.verl, cfg.kubernetes
    )


# ---- the manifest --------------------------------------------------------------------------
def test_manifest_follows_kuberays_rayjob_api_and_kubernetes_pod_schema(tmp_path):
    cfg = multinode_cfg(tmp_path)
    m = manifest_for(cfg)
    validate_rayjob(m)
    cluster = m["spec"]["rayClusterSpec"]
    (workers,) = cluster["workerGroupSpecs"]
    for template in (cluster["headGroupSpec"]["template"], workers["template"]):
        spec = template["spec"]
        assert {"name": "shared", "persistentVolumeClaim": {"claimName": "verl-shared"}} in spec[
            "volumes"
        ]
        (ray,) = spec["containers"]
        assert ray["image"] == "ghcr.io/x/sparring:1-gpu"
        assert {"name": "shared", "mountPath": str(tmp_path / "shared")} in ray["volumeMounts"]
    # nnodes worker pods of n_gpus_per_node GPUs each, pinned (no autoscaling), on GPU nodes
    assert workers["replicas"] == workers["minReplicas"] == workers["maxReplicas"] == 3
    limits = workers["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == "4" and workers["rayStartParams"]["num-gpus"] == "4"
    assert workers["template"]["spec"]["nodeSelector"] == {"gpu": "h100"}
    head = cluster["headGroupSpec"]["template"]["spec"]
    assert "nvidia.com/gpu" not in head["containers"][0]["resources"]["limits"]
    assert "nodeSelector" not in head
    # the same image runs verl's main_ppo with the composed config and the env it reads
    assert shlex.split(m["spec"]["entrypoint"])[:3] == ["python", "-m", "verl.trainer.main_ppo"]
    runtime = yaml.safe_load(m["spec"]["runtimeEnvYAML"])
    assert runtime == {"env_vars": {"VERL_FILE_LOGGER_PATH": "/mnt/x/metrics.jsonl"}}
    # GPUs are freed: the cluster goes when the job ends, the job by its deadline
    assert m["spec"]["shutdownAfterJobFinishes"] is True
    assert m["spec"]["activeDeadlineSeconds"] == cfg.verl.rayjob.timeout_seconds
    assert len(m["metadata"]["name"]) <= 47
    kept = manifest_for(multinode_cfg(tmp_path, keep_failed=True))
    assert kept["spec"]["shutdownAfterJobFinishes"] is False  # the failed cluster stays to debug


@pytest.mark.parametrize(
    "break_it",
    [
        lambda m: m["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["rayStartParams"].update(
            {"num-gpus": 4}  # map[string]string: an int is rejected by the API server
        ),
        lambda m: m["spec"]["submitterConfig"].update({"backoffLimit": "2"}),  # an int32
        lambda m: m["spec"]["submitterPodTemplate"]["spec"].update({"restartPolicyy": "Never"}),
        lambda m: m["spec"].update({"shutdownAfterJobFinish": True}),  # typo of a real field
        lambda m: m["spec"]["rayClusterSpec"]["workerGroupSpecs"][0].pop("groupName"),
        lambda m: m["metadata"].update({"name": "Sparring_Verl"}),
    ],
)
def test_the_checks_reject_what_kuberay_would(tmp_path, break_it):
    m = manifest_for(multinode_cfg(tmp_path))
    break_it(m)
    errors = (jsonschema.ValidationError, kubernetes_validate.ValidationError, ValueError)
    with pytest.raises(errors):
        validate_rayjob(m)


def test_every_ray_pod_is_restricted_sidecar_free_and_pulls_with_the_secrets(tmp_path):
    """Secured clusters: the submitter (KubeRay's default would get no pull secrets and idle
    the GPUs until the deadline), the head and the workers all meet the `restricted` Pod
    Security Standard, start without an Istio sidecar (the submitter Job could never complete
    with one), carry the labels the chart's NetworkPolicy selects, and write the shared volume
    as the pods' group."""
    m = manifest_for(multinode_cfg(tmp_path))
    for template in pod_templates(m):
        spec = template["spec"]
        assert restricted_violations(spec) == []
        assert template["metadata"]["labels"] == rayjob.RAY_POD_LABELS
        assert template["metadata"]["labels"]["sidecar.istio.io/inject"] == "false"
        assert spec["imagePullSecrets"] == [{"name": "regcred"}]
        assert spec["securityContext"]["fsGroup"] == spec["securityContext"]["runAsGroup"]
    submitter = m["spec"]["submitterPodTemplate"]["spec"]
    (container,) = submitter["containers"]
    assert "command" not in container  # KubeRay fills in `ray job submit ...`
    assert (
        container["image"] == "ghcr.io/x/sparring:1-gpu" and submitter["restartPolicy"] == "Never"
    )
    # a transient submitter failure is retried (KubeRay's retry checks `ray job status` first)
    assert m["spec"]["submitterConfig"]["backoffLimit"] >= 2


def test_nnodes_above_one_needs_a_shared_volume():
    with pytest.raises(ValueError, match="set verl.rayjob.shared_pvc"):
        PipelineConfig.model_validate(
            {"train_backend": "verl", "games_per_iteration": 1024, "verl": {"nnodes": 2}}
        )


# ---- create / wait / stream / delete against the fake API server ---------------------------
def settings(**kw) -> RayJobSettings:
    return RayJobSettings(shared_pvc="v", poll_seconds=0.01, **kw)


def test_a_succeeded_rayjob_streams_its_log_and_is_deleted(tmp_path):
    lines = [f"(TaskRunner) step:{i} - actor/pg_loss:0.{i}" for i in range(5)]
    manifest = manifest_for(multinode_cfg(tmp_path))
    with FakeKube(
        [{}, {"jobDeploymentStatus": "Initializing"}, RUNNING, RUNNING, DONE], lines
    ) as kube:
        out = io.StringIO()
        status = rayjob.run_rayjob(kube.client(), manifest, settings(), out=out)
    name = manifest["metadata"]["name"]
    assert status["jobStatus"] == "SUCCEEDED"
    assert kube.created[name] == manifest  # what the API server received, unchanged
    assert kube.deleted == [name]
    streamed = [line for line in out.getvalue().splitlines() if not line.startswith("[sparring]")]
    assert streamed == lines[:4]  # each line once, in order, as the submitter printed it


def test_a_stale_rayjob_of_an_earlier_attempt_is_replaced(tmp_path):
    manifest = manifest_for(multinode_cfg(tmp_path))
    name = manifest["metadata"]["name"]
    with FakeKube([DONE], ["done"]) as kube:
        kube.live.add(name)  # left running by a pod that died
        rayjob.run_rayjob(
            kube.client(), manifest, settings(), out=io.StringIO(), sleep=lambda s: None
        )
    assert kube.deleted == [name, name]  # the stale one, then ours when it ended
    assert kube.created[name] == manifest


@pytest.mark.parametrize("keep", [False, True])
def test_a_failed_rayjob_fails_with_its_last_lines(tmp_path, keep):
    lines = [f"line {i}" for i in range(60)] + ["ValueError: train_batch_size too large"]
    manifest = manifest_for(multinode_cfg(tmp_path))
    statuses = [RUNNING] * 60 + [FAILED]
    with FakeKube(statuses, lines) as kube:
        with pytest.raises(rayjob.RayJobError) as err:
            rayjob.run_rayjob(
                kube.client(), manifest, settings(keep_failed=keep, log_tail=5), out=io.StringIO()
            )
    message = str(err.value)
    assert "reason=AppFailed" in message and "exit code 1" in message
    assert message.splitlines()[-5:] == lines[-6:-1]  # the last 5 lines the log showed
    name = manifest["metadata"]["name"]
    assert kube.deleted == ([] if keep else [name])
    assert (f"kubectl delete rayjob {name}" in message) is keep


def test_a_rayjob_past_its_deadline_fails_and_is_deleted(tmp_path):
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += 600  # each poll is ten minutes of a stuck job

    manifest = manifest_for(multinode_cfg(tmp_path))
    with FakeKube([RUNNING], ["waiting for GPUs"]) as kube:
        with pytest.raises(rayjob.RayJobError, match="timed out"):
            rayjob.run_rayjob(
                kube.client(),
                manifest,
                settings(timeout_seconds=3600),
                out=io.StringIO(),
                clock=lambda: now[0],
                sleep=sleep,
            )
    assert kube.deleted == [manifest["metadata"]["name"]]
    assert now[0] <= 3600 + 600  # gave up at the first poll past the deadline


def rules_of(role: dict) -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_the_chart_grants_exactly_the_calls_the_task_makes(tmp_path):
    from helm_python import Chart

    manifest = manifest_for(multinode_cfg(tmp_path))
    used: set[tuple[str, str, str]] = set()
    for statuses in ([RUNNING, DONE], [RUNNING, FAILED]):
        with FakeKube(statuses, ["x"]) as kube:
            failing = statuses[-1] is FAILED
            with pytest.raises(rayjob.RayJobError) if failing else contextlib.nullcontext():
                rayjob.run_rayjob(kube.client(), manifest, settings(), out=io.StringIO())
        used |= kube.calls
    docs = render(Chart.load(str(CHART)), MINIMAL)
    roles = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Role"}
    assert rules_of(roles[f"{RELEASE}-rayjobs"]) == used
    bindings = {d["metadata"]["name"]: d for d in docs if d["kind"] == "RoleBinding"}
    ours, runner = bindings[f"{RELEASE}-rayjobs"], bindings[f"{RELEASE}-runner"]
    assert ours["roleRef"]["name"] == f"{RELEASE}-rayjobs"
    assert ours["subjects"] == runner["subjects"]  # the account the pipeline's tasks run as
    off = render(Chart.load(str(CHART)), {**MINIMAL, "rbac": {"rayJobs": False}})
    assert not [d for d in off if d["metadata"]["name"] == f"{RELEASE}-rayjobs"]


# ---- the whole verl task with nnodes > 1 ---------------------------------------------------
def write_fsdp_checkpoint(ckpt: Path, model_dir: Path) -> dict[str, torch.Tensor]:
    """What verl's FSDP checkpoint manager leaves for one rank: fsdp_config.json, the rank's
    state dict and the HF config/tokenizer under huggingface/. The weights are the model's,
    shifted, so that the merge is seen to carry the trained weights."""
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    state = {k: v + 0.5 for k, v in model.state_dict().items()}
    actor = ckpt / "global_step_2" / "actor"
    (actor / "huggingface").mkdir(parents=True)
    (actor / "fsdp_config.json").write_text(json.dumps({"FSDP_version": 2, "world_size": 1}))
    torch.save(state, actor / "model_world_size_1_rank_0.pt")
    for f in model_dir.iterdir():
        if f.suffix in (".json", ".jinja", ".txt") and f.name != "model.safetensors.index.json":
            (actor / "huggingface" / f.name).write_bytes(f.read_bytes())
    return state


def test_the_verl_task_runs_a_rayjob_and_collects_its_checkpoint(tiny_model_dir, tmp_path):
    cfg = multinode_cfg(tmp_path)
    inits = tasks.game_init(cfg, tmp_path / "inits", "r")
    seen: dict[str, object] = {}

    def ray_job(status: dict, manifest: dict) -> None:
        """What the Ray job does, from the entrypoint: read the staged inputs, write verl's
        checkpoint and metrics on the shared volume."""
        if status is not DONE or "state" in seen:
            return
        args = dict(a.split("=", 1) for a in shlex.split(manifest["spec"]["entrypoint"])[3:])
        model, data = Path(args["actor_rollout_ref.model.path"]), Path(args["data.train_files"])
        seen["staged"] = (model / "config.json").exists() and data.exists()
        seen["state"] = write_fsdp_checkpoint(Path(args["trainer.default_local_dir"]), model)
        env = yaml.safe_load(manifest["spec"]["runtimeEnvYAML"])["env_vars"]
        record = {"step": 2, "data": {"actor/pg_loss": -0.25, "critic/score/mean": 0.5}}
        Path(env["VERL_FILE_LOGGER_PATH"]).write_text(json.dumps(record) + "\n")

    lines = ["Started a local Ray instance.", "(TaskRunner) step:2 - actor/pg_loss:-0.25"]
    with FakeKube([RUNNING, RUNNING, DONE], lines, on_status=ray_job) as kube:
        metrics = verl_task.train_verl(
            cfg,
            str(tiny_model_dir),
            str(inits["train"]),
            str(inits["val"]),
            0,
            16,
            tmp_path / "model",
            tmp_path / "work",
            run_name="r1",
            client=kube.client(),
        )
    assert seen["staged"]  # the Ray pods found the model and the rows on the shared volume
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "model").state_dict()
    for key, value in seen["state"].items():  # verl's checkpoint as a HF model (merged in bf16)
        torch.testing.assert_close(merged[key], value.to(merged[key].dtype))
    assert metrics["verl/step"] == 2 and metrics["verl/actor/pg_loss"] == -0.25
    log = (tmp_path / "work/verl.log").read_text().splitlines()
    assert [line for line in log if not line.startswith("[sparring]")] == lines
    assert (tmp_path / "work/data/train.parquet").exists()
    assert kube.deleted == [rayjob.rayjob_name("r1", 0)]
    assert not (tmp_path / "shared/r1/0").exists()  # the shared stage is cleaned up


def test_the_compiled_verl_task_mounts_the_shared_volume_and_requests_no_gpu(tmp_path):
    from sparring.pipelines.selfplay import compile_pipeline

    cfg = multinode_cfg(tmp_path)
    spec, platform = yaml.safe_load_all(open(compile_pipeline(cfg, str(tmp_path / "p.yaml"))))
    executor = spec["deploymentSpec"]["executors"]["exec-train-verl"]["container"]
    assert "accelerator" not in executor.get("resources", {})  # the GPUs are the RayJob's
    k8s = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]["exec-train-verl"]
    mounts = {m["mountPath"]: m["constant"] for m in k8s["pvcMount"]}
    assert mounts[str(tmp_path / "shared")] == "verl-shared"


def test_the_ray_cluster_runs_the_images_own_stack():
    """rayVersion is the GPU image's ray, and that image holds what the RayJob runs: verl with
    its verl-core extra (TransferQueue) and the kubernetes client the verl task uses."""
    lock = (Path(__file__).parents[2] / "images" / "requirements-gpu.lock").read_text()
    pins = dict(re.findall(r"^([a-z0-9_.-]+)==([^ \\]+)", lock, flags=re.M))
    assert pins["ray"] == rayjob.RAY_VERSION
    assert pins["verl"] == "0.9.1" and pins["transferqueue"] == "0.1.11"
    assert "kubernetes" in pins
