"""The KFP backend contract, piece by piece (issue 14): run parameters with one source of truth,
the compile-time fingerprint, the device per step, run identity and stale parent runs, the
configured S3 endpoint, write-once checkpoints, checksums, pipeline versions, and static checks
over the compiled IR. The whole pipeline under the emulated backend: test_kfp_backend.py."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError
from sparring.pipelines.driver import unique_run_name, version_name
from sparring.pipelines.selfplay import compile_pipeline

from sparring import storage
from sparring.loop import run_params
from sparring.loop.config import PURE_STEPS, PipelineConfig
from sparring.tracking import numeric

GPU_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "pipeline-gpu.yaml"


def gpu_cfg(**update) -> PipelineConfig:
    """configs/pipeline-gpu.yaml with fields replaced (`kubernetes__eval_gpus=0`)."""
    data = yaml.safe_load(GPU_CONFIG.read_text())
    for path, value in update.items():
        *parents, leaf = path.split("__")
        node = data
        for key in parents:
            node = node[key]
        node[leaf] = value
    return PipelineConfig.model_validate(data)


# ---- 1. Metrics metadata on the backend --------------------------------------------------------
def test_only_numeric_metadata_is_a_metric():
    metadata = {"eval/x": 0.5, "rollout/games": 4, "display_name": "metrics"}
    metadata |= {"store_session_info": '{"Provider": "s3"}', "flag": True}
    assert numeric(metadata) == {"eval/x": 0.5, "rollout/games": 4.0}


# ---- run parameters and the compile-time fingerprint ----------------------------------------
def test_a_changed_run_parameter_sets_its_field_and_an_unchanged_one_keeps_the_config():
    cfg = gpu_cfg()
    compiled = run_params.compile_time(cfg)
    config = cfg.model_copy(update={"games_per_iteration": 256}).model_dump_json()
    params = run_params.values(cfg) | {"learning_rate": 3e-6, "sampling_seed": -1.0}
    got = run_params.resolve(config, params, compiled)
    assert got.train.lr == 3e-6 and got.rollout.sampling.seed is None
    assert got.games_per_iteration == 256  # set in `config`, its parameter left at its default
    assert run_params.resolve(cfg.model_dump_json(), run_params.values(cfg), compiled) == cfg


def test_a_field_changed_both_ways_is_rejected():
    cfg = gpu_cfg()
    config = gpu_cfg(registered_model="from-config").model_dump_json()
    with pytest.raises(ValueError, match="registered_model='from-param' conflicts with the `conf"):
        run_params.resolve(config, {"registered_model": "from-param"}, run_params.compile_time(cfg))


def test_a_config_that_changes_the_graph_is_rejected():
    cfg = gpu_cfg()
    config = gpu_cfg(iterations=3, kubernetes__eval_gpus=0).model_dump_json()
    with pytest.raises(
        ValueError, match=r"compile-time fields \['iterations', 'kubernetes.eval_gpus'\]"
    ):
        run_params.resolve(config, {}, run_params.compile_time(cfg))


def test_the_ui_shows_typed_described_parameters_and_the_champion(tmp_path):
    cfg = gpu_cfg(iterations=2)
    spec = next(
        yaml.safe_load_all(Path(compile_pipeline(cfg, str(tmp_path / "p.yaml"))).read_text())
    )
    params = spec["root"]["inputDefinitions"]["parameters"]
    kinds = {str: "STRING", int: "NUMBER_INTEGER", float: "NUMBER_DOUBLE"}
    for name, param in run_params.RUN_PARAMETERS.items():
        assert params[name]["parameterType"] == kinds[param.type]
        assert params[name]["description"] == param.help
        assert params[name]["defaultValue"] == pytest.approx(run_params.values(cfg)[name])
    assert spec["pipelineInfo"]["description"].startswith("Self-play GRPO")
    outputs = spec["root"]["outputDefinitions"]["parameters"]
    assert set(outputs) == {"champion_version", "champion_score"}


# ---- 3. the device per step ------------------------------------------------------------------
def test_a_step_without_accelerators_runs_on_the_cpu():
    cfg = gpu_cfg(kubernetes__eval_gpus=0)
    assert cfg.for_step("evaluate").device == "cpu" and cfg.for_step("register").device == "cpu"
    assert cfg.for_step("rollout").device == cfg.for_step("train").device == "cuda"
    with pytest.raises(ValidationError, match="no step requests an accelerator"):
        gpu_cfg(kubernetes__rollout_gpus=0, kubernetes__train_gpus=0, kubernetes__eval_gpus=0)


# ---- static checks over the compiled IR -------------------------------------------------------
def test_every_task_is_non_root_bounded_and_side_effect_tasks_never_cache(tmp_path):
    cfg = gpu_cfg(
        iterations=2,
        kubernetes__caching=True,
        kubernetes__image_pull_secrets=["regcred"],
        kubernetes__kfp_version="2.17",  # the run deadline is a 2.17 field (test_kfp_protos)
    )
    spec, platform = yaml.safe_load_all(
        Path(compile_pipeline(cfg, str(tmp_path / "p.yaml"))).read_text()
    )
    run_config = platform["platforms"]["kubernetes"]["pipelineConfig"]
    assert run_config["activeDeadlineSeconds"] == cfg.kubernetes.run_deadline_seconds
    k8s = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    dags = [spec["root"], *(c for c in spec["components"].values() if "dag" in c)]
    tasks_ = [t for d in dags for t in d["dag"]["tasks"].values()]
    executed = [
        t for t in tasks_ if "executorLabel" in spec["components"][t["componentRef"]["name"]]
    ]
    assert len(executed) == 3 + 4 * cfg.iterations + 1
    for task in executed:
        label = spec["components"][task["componentRef"]["name"]]["executorLabel"]
        container = spec["deploymentSpec"]["executors"][label]["container"]
        assert k8s[label]["securityContext"] == {
            "runAsUser": "10001",
            "runAsGroup": "0",
            "runAsNonRoot": True,
        }
        assert [s["secretName"] for s in k8s[label]["imagePullSecret"]] == ["regcred"]
        assert int(k8s[label]["activeDeadlineSeconds"]) > 0
        assert {"/tmp"} <= {m["mountPath"] for m in k8s[label]["emptyDirMounts"]}
        res = container["resources"]
        assert {
            "resourceCpuRequest",
            "resourceCpuLimit",
            "resourceMemoryRequest",
            "resourceMemoryLimit",
        } <= set(res)
        env = {e["name"]: e["value"] for e in container["env"]}
        assert (
            env["AWS_REQUEST_CHECKSUM_CALCULATION"]
            == env["AWS_RESPONSE_CHECKSUM_VALIDATION"]
            == "when_required"
        )
        pure = task["taskInfo"]["name"] in PURE_STEPS
        assert task["cachingOptions"].get("enableCache", False) is pure


def test_the_charts_pull_secrets_reach_every_pipeline_pod(tmp_path):
    from helm_python import Chart
    from test_helm import CHART, MINIMAL, pipeline_config, render

    values = MINIMAL | {"image": {**MINIMAL.get("image", {}), "pullSecrets": ["regcred"]}}
    rendered = pipeline_config(render(Chart.load(str(CHART)), values))
    cfg = PipelineConfig.model_validate(rendered | {"iterations": 1})
    assert cfg.kubernetes.image_pull_secrets == ["regcred"]
    _, platform = yaml.safe_load_all(
        Path(compile_pipeline(cfg, str(tmp_path / "p.yaml"))).read_text()
    )
    executors = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    assert all(e["imagePullSecret"][0]["secretName"] == "regcred" for e in executors.values())


# ---- 5. write-once checkpoints, 9. checksums -------------------------------------------------
def test_a_checkpoint_prefix_is_write_once(s3_server, tiny_model_dir, tmp_path):
    config = storage.StorageConfig(
        endpoint_url=s3_server.endpoint_url,
        access_key_id=s3_server.access_key,
        secret_access_key=s3_server.secret_key,
    )
    uri = f"s3://sparring/once-{uuid.uuid4().hex[:6]}/0/checkpoint"
    first = storage.upload_dir(tiny_model_dir, uri, config, write_once=True)
    assert storage.upload_dir(tiny_model_dir, uri, config, write_once=True) == first  # a retry
    other = tmp_path / "other"
    other.mkdir()
    (other / "model.safetensors").write_bytes(b"new weights")
    with pytest.raises(storage.AlreadyStoredError, match="write-once"):
        storage.upload_dir(other, uri, config, write_once=True)
    assert storage.verify(uri, config, deep=True) == first
    client = config.client()
    assert client.meta.config.request_checksum_calculation == "when_required"
    assert client.meta.config.response_checksum_validation == "when_required"


# ---- 7. pipeline versions and run names -------------------------------------------------------
def test_pipeline_versions_are_named_by_content_and_run_names_are_unique(tmp_path):
    cfg = gpu_cfg(iterations=1)
    a = compile_pipeline(cfg, str(tmp_path / "a.yaml"))
    b = compile_pipeline(cfg, str(tmp_path / "b.yaml"))
    c = compile_pipeline(gpu_cfg(iterations=2), str(tmp_path / "c.yaml"))
    assert version_name(cfg, a) == version_name(cfg, b) != version_name(cfg, c)
    assert version_name(cfg, a).startswith(f"{cfg.name}-")
    assert len({unique_run_name("nightly") for _ in range(20)}) == 20


def executor_env(spec: dict, component_prefix: str) -> list[dict[str, str]]:
    """The env of every executor whose component name starts with `component_prefix`."""
    labels = [
        c["executorLabel"]
        for name, c in spec["components"].items()
        if name.startswith(f"comp-{component_prefix}") and "executorLabel" in c
    ]
    return [
        {
            e["name"]: e["value"]
            for e in spec["deploymentSpec"]["executors"][label]["container"]["env"]
        }
        for label in labels
    ]


@pytest.mark.parametrize("gpus", [1, 0])
def test_register_records_the_image_that_trained_the_model(gpus, tmp_path):
    """The register task runs on the CPU image; the model it registers pins the stack of the
    image the train task ran on (sparring.registry.trainer_requirements)."""
    from sparring.registry import TRAINER_IMAGE_ENV

    cfg = gpu_cfg(iterations=1, kubernetes__train_gpus=gpus, kubernetes__rollout_gpus=1)
    spec, _ = yaml.safe_load_all(Path(compile_pipeline(cfg, str(tmp_path / "p.yaml"))).read_text())
    (env,) = executor_env(spec, "register")
    k8s = cfg.kubernetes
    assert env[TRAINER_IMAGE_ENV] == (k8s.gpu_image if gpus else k8s.image)
    assert k8s.gpu_image.endswith("-gpu") and k8s.image.endswith("-cpu")


@pytest.mark.parametrize(
    ("user", "group", "expected"),
    [
        (10001, 0, {"runAsUser": "10001", "runAsGroup": "0", "runAsNonRoot": True}),
        (None, 0, {"runAsGroup": "0", "runAsNonRoot": True}),  # OpenShift restricted-v2
        (None, None, {"runAsNonRoot": True}),
    ],
)
def test_a_null_uid_or_gid_is_left_to_the_cluster(user, group, expected, tmp_path):
    """OpenShift's restricted-v2 SCC assigns each pod a uid from its namespace's range and
    rejects any other: `run_as_user: null` leaves runAsUser out of every executor's security
    context (non-root stays required)."""
    cfg = gpu_cfg(iterations=1, kubernetes__run_as_user=user, kubernetes__run_as_group=group)
    _, platform = yaml.safe_load_all(
        Path(compile_pipeline(cfg, str(tmp_path / "p.yaml"))).read_text()
    )
    executors = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    assert {json.dumps(e["securityContext"], sort_keys=True) for e in executors.values()} == {
        json.dumps(expected, sort_keys=True)
    }
    with pytest.raises(ValidationError, match="run_as_user"):
        gpu_cfg(kubernetes__run_as_user=0)  # root is never a choice
