"""The compiled pipeline: GPU requests, Kubernetes settings and images come from the config,
the loop is unrolled, the committed YAML is current, and every shipped config validates."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from pydantic import ValidationError

import sparring
from sparring.cli import main
from sparring.loop.config import CONFIG_DIR, PipelineConfig
from sparring.loop.run_params import RUN_PARAMETERS

ROOT = Path(__file__).resolve().parents[2]
GPU_CONFIG = CONFIG_DIR / "pipeline-gpu.yaml"
MIX = {"selfplay_fraction": 0.5, "difficulty": {"pool": ["matching-scripted"]}}  # matching's bot


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


def task_keys(spec: dict) -> dict[str, str]:
    """Each task's display name -> its key in its DAG (root or the exit handler's)."""
    dags = [spec["root"], *(c for c in spec["components"].values() if "dag" in c)]
    return {t["taskInfo"]["name"]: k for d in dags for k, t in d["dag"]["tasks"].items()}


def compiled(overrides: dict, path: Path) -> tuple[dict[str, str], dict[str, dict]]:
    """A config with `overrides` compiled to `path`: each task's key by display name, and
    each task by display name."""
    from sparring.pipelines.selfplay import compile_pipeline

    cfg = PipelineConfig.model_validate(overrides)
    spec = next(yaml.safe_load_all(Path(compile_pipeline(cfg, str(path))).read_text()))
    return task_keys(spec), {t["taskInfo"]["name"]: t for t in all_tasks(spec)}


def producer(tasks: dict[str, dict], task: str, name: str) -> str:
    """The key of the task whose output `task`'s input artifact `name` is."""
    return tasks[task]["inputs"]["artifacts"][name]["taskOutputArtifact"]["producerTask"]


def executors_of(spec: dict, prefix: str) -> list[str]:
    """Executor labels of the tasks (in the root DAG or the exit handler's) whose component
    name starts with `comp-<prefix>`."""
    names = [t["componentRef"]["name"] for t in all_tasks(spec)]
    return [spec["components"][c]["executorLabel"] for c in names if c.startswith(f"comp-{prefix}")]


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
                mounts = platform[label]["emptyDirMounts"]
                shm = next(m for m in mounts if m["mountPath"] == "/dev/shm")
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
    assert set(params) == {"config", *RUN_PARAMETERS}
    assert PipelineConfig.model_validate_json(params["config"]["defaultValue"]) == cfg


def _spec_docs(path: Path) -> list[dict]:
    """The YAML documents of a compiled pipeline, less the compiler's own version stamp.

    `sdkVersion` follows whichever kfp patch release pip resolved; the spec is what matters.
    """
    docs = list(yaml.safe_load_all(path.read_text()))
    docs[0].pop("sdkVersion")
    return docs


def test_committed_yaml_is_current(gpu_yaml):
    committed = ROOT / "pipelines" / "selfplay.yaml"
    assert _spec_docs(gpu_yaml) == _spec_docs(committed), (
        "pipelines/selfplay.yaml is stale: sparring compile --config configs/pipeline-gpu.yaml "
        "-o pipelines/selfplay.yaml"
    )


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"rollout": {"game": {"params": {"k": 5}}}}, "set it once, at the top"),
        ({"games_per_iteration": 6, "rollout": {"games_per_init": 4}}, "multiple of"),
        ({"train": {"group_key": "planet"}}, "unknown group key 'planet' for matching"),
        ({"train": {"device": "cpu"}}, "set the top-level `device`"),
        ({"group_key": "init"}, "Extra inputs are not permitted"),
        ({"kubernetes": {"gpus": 1}}, "Extra inputs are not permitted"),
        ({"opponents": {"selfplay_fraction": 1.5}}, "less than or equal to 1"),
        ({"opponents": {"difficulty": {"windw": 3}}}, "Extra inputs are not permitted"),
        ({"opponents": {"selfplay_fraction": 0.5}}, "needs opponents.difficulty.pool"),
        (
            {"opponents": {"selfplay_fraction": 0.5, "difficulty": {"pool": ["greedy"]}}},
            "not scripted agents of matching",
        ),
        ({"rollout": {"seats": ["policy", "matching-scripted"]}, "opponents": MIX}, "not both"),
    ],
)
def test_config_errors_name_the_fix(override, message):
    with pytest.raises(ValidationError, match=message):
        PipelineConfig.model_validate({"game": {"params": {"k": 3}}, **override})


def test_opponent_pool_is_the_games_scripted_agents_and_past_checkpoints():
    def dip(*pool: str) -> PipelineConfig:
        mix = {"selfplay_fraction": 0.5, "difficulty": {"pool": list(pool)}}
        return PipelineConfig.model_validate({"game": "diplomacy", "opponents": mix})

    for bad in ("iter-3", "past-0", "past-", "past-01", "matching-scripted"):
        with pytest.raises(ValidationError, match=rf"names \['{bad}'\], which are not scripted"):
            dip("hold", bad)
    assert dip("hold", "past-3", "greedy", "past-1").opponents.checkpoint_steps == [1, 3]
    assert dip("hold", "greedy").opponents.checkpoint_steps == []


def test_rollout_waits_for_the_past_checkpoint_it_loads(tmp_path):
    """Pool `past-1`: rollout i loads the checkpoint register i-2 stores, so it runs after it."""
    from sparring.pipelines.selfplay import compile_pipeline

    mix = {"selfplay_fraction": 0.5, "difficulty": {"pool": ["matching-scripted", "past-1"]}}
    cfg = PipelineConfig.model_validate(
        {"game": {"params": {"k": 3}}, "iterations": 3, "opponents": mix}
    )
    compiled = Path(compile_pipeline(cfg, str(tmp_path / "past.yaml")))
    spec = next(yaml.safe_load_all(compiled.read_text()))
    keys = task_keys(spec)
    tasks = {t["taskInfo"]["name"]: t for t in all_tasks(spec)}
    registers = {keys[f"register-{i}"] for i in range(3)}
    waits = [registers & set(tasks[f"rollout-{i}"].get("dependentTasks", [])) for i in range(3)]
    assert waits == [set(), set(), {keys["register-0"]}]


def test_each_rollout_gets_the_previous_rollouts_schedule(gpu_yaml):
    spec = next(yaml.safe_load_all(gpu_yaml.read_text()))
    keys = task_keys(spec)
    tasks = {t["taskInfo"]["name"]: t for t in all_tasks(spec)}
    cfg = PipelineConfig.from_yaml(GPU_CONFIG)
    first = cfg.first_iteration
    assert "previous_schedule" not in tasks[f"rollout-{first}"]["inputs"]["artifacts"]
    for i in range(first + 1, first + cfg.iterations):
        source = tasks[f"rollout-{i}"]["inputs"]["artifacts"]["previous_schedule"]
        assert source["taskOutputArtifact"] == {
            "producerTask": keys[f"rollout-{i - 1}"],
            "outputArtifactKey": "schedule",
        }


def test_train_logs_to_the_parent_run_and_register_tags_the_kfp_run(gpu_yaml):
    """Train i logs its optimizer steps live to start's parent run (iteration i); register i
    tags the version with the KFP run's uuid, the same value start gets as `job_id`."""
    spec = next(yaml.safe_load_all(gpu_yaml.read_text()))
    tasks = {t["taskInfo"]["name"]: t["inputs"]["parameters"] for t in all_tasks(spec)}
    parent = {
        "taskOutputParameter": {"outputParameterKey": "parent_run_id", "producerTask": "start"}
    }
    for i in range(PipelineConfig.from_yaml(GPU_CONFIG).iterations):
        assert tasks[f"train-{i}"]["parent_run_id"] == parent
        assert tasks[f"train-{i}"]["iteration"] == {"runtimeValue": {"constant": i}}
        assert tasks[f"register-{i}"]["kfp_run_id"] == tasks["start"]["job_id"]
    assert tasks["start"]["job_id"] == {"runtimeValue": {"constant": "{{$.pipeline_job_uuid}}"}}


def test_train_sections_are_checked_with_the_config():
    with pytest.raises(ValueError, match="warm_start.train.lr"):
        PipelineConfig.model_validate({"warm_start": {"train": {"lr": -1}}})


def test_game_is_set_once():
    cfg = PipelineConfig.model_validate({"game": {"params": {"k": 3}}})
    assert cfg.rollout.game == cfg.eval.game == cfg.game_init.game == cfg.game
    assert cfg.game.params == {"k": 3}
    assert cfg.registered_model == f"sparring-matching-{cfg.eval_key}"  # one per evaluation


def test_deprecated_group_key_alias_is_accepted_with_a_warning():
    with pytest.warns(
        DeprecationWarning, match="'country_phase' is deprecated; use 'country_stage'"
    ):
        cfg = PipelineConfig.model_validate(
            {"game": "diplomacy", "train": {"group_key": "country_phase"}}
        )
    assert cfg.group_key == "country_stage"


# ---- train_backend: verl ------------------------------------------------------------------
def verl_config(**verl) -> PipelineConfig:
    data = yaml.safe_load(GPU_CONFIG.read_text())
    data |= {"iterations": 2, "train_backend": "verl", "verl": {"n_gpus_per_node": 4, **verl}}
    return PipelineConfig.model_validate(data)


def test_verl_pipeline_replaces_rollout_and_train_with_one_gpu_task(tmp_path):
    from sparring.pipelines.selfplay import compile_pipeline

    cfg = verl_config(tp_size=2)
    k8s = cfg.kubernetes
    out = Path(compile_pipeline(cfg, str(tmp_path / "verl.yaml")))
    spec, platform_doc = yaml.safe_load_all(out.read_text())
    platform = platform_doc["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    containers = spec["deploymentSpec"]["executors"]
    keys = task_keys(spec)
    tasks = {t["taskInfo"]["name"]: t for t in all_tasks(spec)}
    components = {t["componentRef"]["name"] for t in tasks.values()}
    assert "comp-rollout" not in components and "comp-train" not in components
    assert not [n for n in tasks if n.startswith(("rollout", "train-"))]
    labels = executors_of(spec, "train-verl")
    assert len(labels) == cfg.iterations
    for label in labels:  # GPU request = verl.n_gpus_per_node, placed like every GPU step
        container = containers[label]["container"]
        assert container["image"] == k8s.gpu_image
        accel = container["resources"]["accelerator"]
        assert (accel["resourceType"], int(accel["resourceCount"])) == ("nvidia.com/gpu", 4)
        assert platform[label]["nodeSelector"]["labels"] == k8s.node_selector
        assert platform[label]["tolerations"][0]["key"] == "nvidia.com/gpu"
        assert "/dev/shm" in {m["mountPath"] for m in platform[label]["emptyDirMounts"]}
        assert platform[label]["secretAsEnv"][0]["secretName"] == k8s.s3_secret
    for step in ("evaluate", "register"):  # unchanged: eval on 1 GPU, register on the CPU image
        assert len(executors_of(spec, step)) == cfg.iterations

    def source(task: dict, name: str) -> tuple[str, str]:
        art = task["inputs"]["artifacts"][name]["taskOutputArtifact"]
        return art["producerTask"], art["outputArtifactKey"]

    # Per iteration: verl-train -> evaluate -> register, each verl-train starting from the last.
    previous = (keys["initial-model"], "model")
    for i in range(cfg.first_iteration, cfg.first_iteration + cfg.iterations):
        vt, ev, rg = tasks[f"verl-train-{i}"], tasks[f"evaluate-{i}"], tasks[f"register-{i}"]
        vt_key = keys[f"verl-train-{i}"]
        assert source(vt, "model") == previous
        assert source(vt, "inits") == (keys["game-init"], "inits")
        assert vt["inputs"]["parameters"]["iteration"]["runtimeValue"]["constant"] == i
        assert "games_per_iteration" in str(vt["inputs"]["parameters"]["games"])
        assert source(ev, "model") == (vt_key, "trained") and source(ev, "previous") == previous
        assert source(rg, "model") == (vt_key, "trained")
        assert source(rg, "samples") == (vt_key, "data")
        assert source(rg, "train_metrics") == source(rg, "rollout_metrics") == (vt_key, "metrics")
        assert source(rg, "evaluation") == (keys[f"evaluate-{i}"], "evaluation")
        previous = (vt_key, "trained")
    executed = [
        t
        for t in tasks.values()
        if "executorLabel" in spec["components"][t["componentRef"]["name"]]
    ]
    assert len(executed) == 3 + bool(cfg.warm_start) + 3 * cfg.iterations + 1  # + finish


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"device": "cpu"}, "verl needs GPUs"),
        ({"verl": {"nnodes": 2}}, "set verl.rayjob.shared_pvc"),
        ({"games_per_iteration": 256}, r"set games_per_iteration >= 512"),
        ({"train_backend": "jax"}, "'torch' or 'verl'"),
        ({"verl": {"rollout_n": 1}}, "greater than or equal to 2"),
        ({"opponents": MIX}, "needs train_backend: torch"),
    ],
)
def test_verl_config_errors_name_the_fix(override, message):
    with pytest.raises(ValidationError, match=message):
        PipelineConfig.model_validate(
            {
                "train_backend": "verl",
                "games_per_iteration": 1024,
                "game": {"params": {"k": 3}},
                **override,
            }
        )


def test_with_carry_each_train_continues_the_previous_trains_optimizer(tmp_path):
    from sparring.pipelines.selfplay import compile_pipeline

    cfg = PipelineConfig.model_validate({"iterations": 3, "train": {"optimizer_state": "carry"}})
    spec = next(
        yaml.safe_load_all(Path(compile_pipeline(cfg, str(tmp_path / "c.yaml"))).read_text())
    )
    keys = task_keys(spec)
    tasks = {t["taskInfo"]["name"]: t for t in all_tasks(spec)}
    assert "previous_optimizer" not in tasks["train-0"]["inputs"]["artifacts"]
    for i in (1, 2):
        source = tasks[f"train-{i}"]["inputs"]["artifacts"]["previous_optimizer"]
        assert source["taskOutputArtifact"] == {
            "producerTask": keys[f"train-{i - 1}"],
            "outputArtifactKey": "optimizer",
        }
    registered = tasks["register-1"]["inputs"]["artifacts"]
    assert all(
        a["taskOutputArtifact"]["outputArtifactKey"] != "optimizer" for a in registered.values()
    )


def test_the_start_and_the_test_evaluation_are_tasks(tmp_path):
    """`evaluate_start`: evaluate--1 plays the warm-started model and records it in the parent
    run; `game_init.num_test`: evaluate-test scores that start and the last trained model."""
    keys, tasks = compiled(
        {"iterations": 2, "warm_start": {}, "evaluate_start": True, "game_init": {"num_test": 4}},
        tmp_path / "t.yaml",
    )

    assert producer(tasks, "evaluate--1", "model") == keys["warm-start"]
    assert "parent_run_id" in tasks["evaluate--1"]["inputs"]["parameters"]
    assert producer(tasks, "evaluate-test", "start") == keys["warm-start"]
    assert producer(tasks, "evaluate-test", "final") == keys["train-1"]


def test_the_magnet_moves_to_the_trained_model_of_every_nth_iteration(tmp_path):
    """`magnet_every: 2`: train-0 and train-1 anchor at the warm start, train-2 and train-3 at
    train-1's model, train-4 at train-3's; the test step still scores the warm start."""
    magnet = {"iterations": 5, "warm_start": {}, "magnet_every": 2, "train": {"kl_coef": 0.1}}
    keys, tasks = compiled(magnet | {"game_init": {"num_test": 4}}, tmp_path / "m.yaml")

    magnets = [producer(tasks, f"train-{i}", "reference") for i in range(5)]
    assert magnets == [keys[t] for t in ("warm-start",) * 2 + ("train-1",) * 2 + ("train-3",)]
    assert producer(tasks, "evaluate-test", "start") == keys["warm-start"]


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({}, r"train.kl_coef > 0"),
        ({"train": {"kl_coef": 0.1}, "population": {"size": 2}}, "population: null"),
    ],
)
def test_a_magnet_without_its_kl_term_or_with_a_population_is_refused(override, message):
    with pytest.raises(ValidationError, match=message):
        PipelineConfig.model_validate({"magnet_every": 2, **override})


def test_a_diplomacy_recipe_compiles_onto_the_diplomacy_images(tmp_path):
    """The engine is AGPL-3.0 and ships only in the `-diplomacy` flavours: a Diplomacy config
    that names no image gets them, one that names its images keeps them."""
    out = tmp_path / "diplomacy.yaml"
    config = CONFIG_DIR / "diplomacy.yaml"
    result = CliRunner().invoke(main, ["compile", "--config", str(config), "-o", str(out)])
    assert result.exit_code == 0, result.output
    spec = next(yaml.safe_load_all(out.read_text()))
    images = {e["container"]["image"] for e in spec["deploymentSpec"]["executors"].values()}
    assert images == {f"ghcr.io/sparring/sparring:{sparring.__version__}-cpu-diplomacy"}
    named = {"image": "registry/cpu:1", "gpu_image": "registry/gpu:1"}
    cfg = PipelineConfig.model_validate({"game": {"name": "diplomacy"}, "kubernetes": named})
    assert (cfg.kubernetes.image, cfg.kubernetes.gpu_image) == tuple(named.values())
    assert PipelineConfig.model_validate({}).kubernetes.image.endswith(
        f"{sparring.__version__}-cpu"
    )


def test_the_average_distills_after_the_last_iteration_and_is_the_final_model(tmp_path):
    """`average`: one task fine-tunes the last trained model on the run's rollouts (it reads
    them from storage by run name), evaluate-average plays it against that last model and
    uploads as member `average`, register-average registers it after register-1 (champion
    decisions in order), and evaluate-test scores it as the final model."""
    keys, tasks = compiled(
        {"iterations": 2, "average": {}, "game_init": {"num_test": 4}}, tmp_path / "a.yaml"
    )

    assert producer(tasks, "average", "last") == keys["train-1"]
    assert "run_name" in tasks["average"]["inputs"]["parameters"]
    assert producer(tasks, "evaluate-average", "model") == keys["average"]
    assert producer(tasks, "evaluate-average", "previous") == keys["train-1"]
    evaluated = tasks["evaluate-average"]["inputs"]["parameters"]
    assert evaluated["member"]["runtimeValue"]["constant"] == "average"
    assert evaluated["iteration"]["runtimeValue"]["constant"] == 1
    assert producer(tasks, "register-average", "model") == keys["average"]
    assert "samples" not in tasks["register-average"]["inputs"].get("artifacts", {})
    assert keys["register-1"] in tasks["register-average"]["dependentTasks"]
    registered = tasks["register-average"]["inputs"]["parameters"]
    assert registered["member"]["runtimeValue"]["constant"] == "average"
    assert producer(tasks, "evaluate-test", "final") == keys["average"]
    assert "member" not in tasks["register-1"]["inputs"]["parameters"]  # the default: own
    assert keys["evaluate-1"] not in tasks["average"]["dependentTasks"]  # beside the last eval


def test_an_average_of_the_tables_waits_for_every_evaluation(tmp_path):
    """`source: tables` reads each iteration's stored evaluation: the average task runs after
    the last register, which follows every evaluate (KFP would otherwise start it beside the
    last evaluation, as soon as the last update exists)."""
    pytest.importorskip("pyspiel")
    kuhn = PipelineConfig.from_yaml(CONFIG_DIR / "kuhn.yaml").model_dump(exclude_unset=True)
    keys, tasks = compiled(
        kuhn | {"iterations": 2, "average": {"source": "tables"}}, tmp_path / "k.yaml"
    )
    assert keys["register-1"] in tasks["average"]["dependentTasks"]
    assert keys["evaluate-0"] in tasks["register-0"]["dependentTasks"]
    assert keys["evaluate-1"] in tasks["register-1"]["dependentTasks"]
    assert keys["register-0"] in tasks["register-1"]["dependentTasks"]


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"population": {"size": 2}}, "population: null"),
        ({"train_backend": "verl", "games_per_iteration": 512}, "train_backend: torch"),
        ({"average": {"source": "tables"}}, "reads out its whole policy \\(not matching\\)"),
    ],
)
def test_an_average_without_the_one_learners_rollouts_is_refused(override, message):
    with pytest.raises(ValidationError, match=f"average distills.*{message}"):
        PipelineConfig.model_validate({"average": {}, **override})
