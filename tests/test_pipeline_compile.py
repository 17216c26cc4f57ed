"""The compiled pipeline: GPU requests, Kubernetes settings and images come from the config,
the loop is unrolled, the committed YAML is current, and every shipped config validates."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from pydantic import ValidationError

from sparring.cli import main
from sparring.pipeline_config import CONFIG_DIR, PipelineConfig

ROOT = Path(__file__).resolve().parent.parent
GPU_CONFIG = CONFIG_DIR / "pipeline-gpu.yaml"


@pytest.fixture(scope="module")
def gpu_yaml(tmp_path_factory) -> Path:
    """configs/pipeline-gpu.yaml compiled by `sparring compile` (once: ~1 s per iteration)."""
    out = tmp_path_factory.mktemp("compile") / "selfplay.yaml"
    result = CliRunner().invoke(main, ["compile", "--config", str(GPU_CONFIG), "-o", str(out)])
    assert result.exit_code == 0, result.output
    return out


def all_tasks(spec: dict) -> list[dict]:
    """Tasks of the root DAG and of the exit handler's sub-DAG."""
    dags = [spec["root"], *(c for c in spec["components"].values() if "dag" in c)]
    return [t for d in dags for t in d["dag"]["tasks"].values()]


def executors_of(spec: dict, prefix: str) -> list[str]:
    """Executor labels of the tasks (in the root DAG or the exit handler's) whose component
    name starts with `comp-<prefix>`."""
    names = [t["componentRef"]["name"] for t in all_tasks(spec)]
    return [spec["components"][c]["executorLabel"] for c in names if c.startswith(f"comp-{prefix}")]


@pytest.mark.parametrize("path", sorted(CONFIG_DIR.glob("pipeline*.yaml")), ids=lambda p: p.name)
def test_shipped_configs_validate(path):
    cfg = PipelineConfig.from_yaml(path)
    cfg.train_config(), cfg.train_config(warm_start=True)


def test_gpu_pipeline(gpu_yaml):
    cfg = PipelineConfig.from_yaml(GPU_CONFIG)
    k8s = cfg.kubernetes
    spec, platform_doc = yaml.safe_load_all(gpu_yaml.read_text())
    platform = platform_doc["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    containers = spec["deploymentSpec"]["executors"]
    gpu_steps = ["rollout", "train", "evaluate"]
    for step in ["start", "game-init", "initial-model", *gpu_steps, "register", "finish"]:
        labels = executors_of(spec, step)
        assert len(labels) == (cfg.iterations if step in [*gpu_steps, "register"] else 1)
        for label in labels:
            container = containers[label]["container"]
            env = platform[label]["secretAsEnv"][0]
            assert env["secretName"] == k8s.s3_secret
            assert {e["envVar"] for e in env["keyToEnv"]} == {
                "AWS_ACCESS_KEY_ID",
                "AWS_SECRET_ACCESS_KEY",
            }
            if step in gpu_steps:
                assert container["image"] == k8s.gpu_image
                accel = container["resources"]["accelerator"]
                assert (
                    accel["resourceType"] == "nvidia.com/gpu" and int(accel["resourceCount"]) == 1
                )
                assert platform[label]["nodeSelector"]["labels"] == k8s.node_selector
                assert platform[label]["tolerations"][0]["key"] == "nvidia.com/gpu"
                shm = platform[label]["emptyDirMounts"][0]
                assert (shm["mountPath"], shm["medium"], shm["sizeLimit"]) == (
                    "/dev/shm",
                    "Memory",
                    k8s.shm_size,
                )
            else:
                assert container["image"] == k8s.image
                assert "accelerator" not in container.get("resources", {})
                assert "nodeSelector" not in platform[label]
    tasks = [
        t
        for t in all_tasks(spec)
        if "executorLabel" in spec["components"][t["componentRef"]["name"]]
    ]
    assert len(tasks) == 3 + bool(cfg.warm_start) + 4 * cfg.iterations + 1  # + finish
    assert all(t["retryPolicy"]["maxRetryCount"] == k8s.retries for t in tasks)
    assert all(t["cachingOptions"].get("enableCache", False) is False for t in tasks)
    params = spec["root"]["inputDefinitions"]["parameters"]
    assert set(params) == {"config", "games_per_iteration", "group_key"}
    assert PipelineConfig.model_validate_json(params["config"]["defaultValue"]) == cfg


def test_committed_yaml_is_current(gpu_yaml):
    committed = ROOT / "pipelines" / "selfplay.yaml"
    assert list(yaml.safe_load_all(gpu_yaml.read_text())) == list(
        yaml.safe_load_all(committed.read_text())
    ), (
        "pipelines/selfplay.yaml is stale: sparring compile --config configs/pipeline-gpu.yaml "
        "-o pipelines/selfplay.yaml"
    )


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"rollout": {"game_params": {"k": 5}}}, "set it once, at the top"),
        ({"games_per_iteration": 6, "rollout": {"games_per_init": 4}}, "multiple of"),
        ({"group_key": "planet"}, "unknown group_key"),
        ({"kubernetes": {"gpus": 1}}, "Extra inputs are not permitted"),
    ],
)
def test_config_errors_name_the_fix(override, message):
    with pytest.raises(ValidationError, match=message):
        PipelineConfig.model_validate({"game_params": {"k": 3}, **override})


def test_train_sections_are_checked_at_build_time():
    from sparring.pipelines.selfplay import build_pipeline

    cfg = PipelineConfig.model_validate({"warm_start": {"train": {"lr": -1}}})
    with pytest.raises(ValueError, match="invalid warm_start.train section"):
        build_pipeline(cfg)


def test_game_is_set_once():
    cfg = PipelineConfig.model_validate({"game_params": {"k": 3}})
    assert cfg.rollout.game_params == cfg.eval.game_params == cfg.game_init.game_params == {"k": 3}
