"""A population (`population: {size: K}`, sparring.loop.population) in the KFP graph: per
iteration one rollout that seats and rates the members, a ParallelFor over the members (train
→ evaluate each) and one register task for all; the IR parses with the backend's protos; and
under kfp.local it plays the same games and reaches the same ratings as the in-process loop,
every member registered under its alias."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
import yaml
from sparring.pipelines.selfplay import compile_pipeline
from test_kfp_protos import parse, protos  # noqa: F401 (a fixture: the backend's protos)
from tiny_pipeline import graph_and_loop, played

from sparring.loop import checkpoints, population
from sparring.loop.config import CONFIG_DIR, PipelineConfig
from sparring.registry import MEMBER_TAG
from sparring.tracking import CHECKPOINT_TAG, connect

MEMBERS = ["member-0", "member-1", "member-2"]


def gpu_population(target: str) -> PipelineConfig:
    """configs/pipeline-gpu.yaml (a GPU per rollout, train and evaluate task) with 3 members,
    2 iterations, compiled for KFP `target`."""
    data = yaml.safe_load((CONFIG_DIR / "pipeline-gpu.yaml").read_text())
    data |= {"iterations": 2, "population": {"size": 3}}
    data["kubernetes"]["kfp_version"] = target
    return PipelineConfig.model_validate(data)


def body_tasks(spec: dict) -> dict[str, dict]:
    """The exit handler's tasks by display name, and the loops' inner tasks under theirs."""
    body = spec["root"]["dag"]["tasks"]["exit-handler-1"]["componentRef"]["name"]
    found = {}
    for key, task in spec["components"][body]["dag"]["tasks"].items():
        found[task["taskInfo"]["name"]] = task | {"key": key}
        inner = spec["components"][task["componentRef"]["name"]].get("dag", {}).get("tasks", {})
        found |= {t["taskInfo"]["name"]: t for t in inner.values()}
    return found


@pytest.mark.parametrize("release", ["2.16", "2.17"])
def test_a_population_compiles_per_member_and_parses_with_the_backends_protos(
    release, request, tmp_path
):
    roots = request.getfixturevalue("protos")
    targets = ["2.16"] + (["2.17"] if release == "2.17" else [])  # 2.17 reads 2.16's IR
    irs = [compile_pipeline(gpu_population(t), str(tmp_path / f"{t}.yaml")) for t in targets]
    report = parse(roots[release], [Path(ir) for ir in irs])
    assert all(r["errors"] == [] for r in report.values()), report

    spec, platform = yaml.safe_load_all(Path(irs[0]).read_text())
    tasks = body_tasks(spec)
    for i in range(2):
        loop = tasks[f"members-{i}"]
        assert json.loads(loop["parameterIterator"]["items"]["raw"]) == MEMBERS
        for step in ("train", "evaluate"):  # one per member: the loop's tasks
            task = tasks[f"{step}-{i}-member"]
            assert task["componentRef"]["name"].startswith(f"comp-population-{step}")
        register = tasks[f"register-{i}"]  # one for all: the order (lead first) is the run's
        collected = register["inputs"]["artifacts"]["models"]["taskOutputArtifact"]
        assert collected["producerTask"] == loop["key"]
        rollout = tasks[f"rollout-{i}"]["inputs"]["artifacts"]
        if i:  # the previous iteration's members and population state are carried on
            assert (
                rollout["members"]["taskOutputArtifact"]["producerTask"]
                == tasks["members-0"]["key"]
            )
            assert (
                rollout["previous_state"]["taskOutputArtifact"]["producerTask"]
                == (tasks["rollout-0"]["key"])
            )
            assert tasks["register-0"]["key"] in register["dependentTasks"]
        else:
            assert "members" not in rollout and "previous_state" not in rollout
    executors = spec["deploymentSpec"]["executors"]
    for step in ("rollout", "train", "evaluate"):  # a GPU each, as the single learner's steps
        gpu = executors[f"exec-population-{step}"]["container"]["resources"]["accelerator"]
        assert gpu["resourceCount"] == "1"
    assert "accelerator" not in executors["exec-population-register"]["container"]["resources"]
    k8s = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    assert k8s["exec-population-train"]["nodeSelector"]["labels"]


def kuhn_population(tmp_path: Path, model: Path) -> PipelineConfig:
    """2 members, 2 iterations of 4 Kuhn Poker games (zero-sum: the ratings move), 1 val state;
    storage and the MLflow store in local files (no server)."""
    tag = uuid.uuid4().hex[:6]
    sampling = {"max_new_tokens": 4}
    return PipelineConfig.model_validate(
        {
            "run_name": f"population-{tag}",
            "game": {"name": "kuhn-poker", "params": {"max_rounds": 1, "reward": "chips"}},
            "model": str(model),
            "iterations": 2,
            "games_per_iteration": 4,
            "device": "cpu",
            "game_init": {"num_train": 4, "num_val": 1},
            "rollout": {"games_per_init": 2, "sampling": sampling},
            "population": {"size": 2},
            "eval": {
                "modes": ["selfplay"],
                "rollout": {"games_per_init": 1, "sampling": sampling | {"temperature": 0.0}},
            },
            "champion_metric": "eval/selfplay/all/normalized_reward",
            "storage": {"root": str(tmp_path / "store")},
            "tracking": {
                "tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}",
                "experiment": "population",
            },
            "registered_model": f"population-{tag}",
        }
    )


@pytest.mark.slow
@pytest.mark.usefixtures("mlflow_db")  # at tmp_path / "mlflow.db": kuhn_population's store
def test_the_kfp_graph_plays_the_same_population_games_as_the_loop(
    tiny_model_dir, tmp_path, forked_tasks
):
    cfg = kuhn_population(tmp_path, tiny_model_dir)
    kfp, loop = graph_and_loop(cfg, tmp_path)
    root = Path(kfp.storage_root)
    for i in range(2):
        graph, process = root / str(i) / "rollout", tmp_path / "work" / str(i) / "rollout"
        assert played(graph) == played(process)
        ratings = [json.loads((f / population.STATE_FILE).read_text()) for f in (graph, process)]
        assert ratings[0] == ratings[1]  # the same rating updates, applied once each
    state = json.loads((root / "1" / "rollout" / population.STATE_FILE).read_text())
    assert [row["iteration"] for row in state["history"]] == [0, 1]  # carried on
    mu = {m: rating[0] for m, rating in state["ratings"].items()}
    assert mu["member-0"] != mu["member-1"]  # zero-sum games rank the members
    # rollout 1 starts each member from its own checkpoint of iteration 0 (at this size no
    # member learns: the tiny model never makes a legal move, so every reward of a member is
    # the same and its weights do not move; the references show what was carried)
    starts = (tmp_path / "runs" / "kfp").glob("*/population-rollout-2/starts/*")
    carried = {folder.name: checkpoints.read(folder).uri for folder in starts}
    assert carried == {m: f"{root}/0/members/{m}/checkpoint" for m in ("member-0", "member-1")}
    # a campaign's next run would start its first rollout from the registered members
    resumed = population.start_members(cfg, root.name, 2, "", tmp_path / "next", download=False)
    uris = {m: checkpoints.read(folder).uri for m, folder in resumed.items()}
    assert uris == {m: f"{root}/1/members/{m}/checkpoint" for m in ("member-0", "member-1")}

    # every member registered under its alias, the lead first, as the loop registers them
    client = connect(cfg.tracking)
    versions = sorted(
        client.search_model_versions(f"name = '{cfg.registered_model}'"),
        key=lambda v: int(v.version),
    )
    work = tmp_path / "work"
    ranked = [population.ranking(work / str(i) / "rollout" / population.STATE_FILE) for i in (0, 1)]
    assert [it.model_dir.name for it in loop.iterations] == [r[0] for r in ranked]
    expected = [(str(i), m) for i, members in enumerate(ranked) for m in members]
    assert [(v.tags["iteration"], v.tags[MEMBER_TAG]) for v in versions] == expected
    for v in versions:  # each member's own checkpoint, stored where the loop stores it
        own = f"{root}/{v.tags['iteration']}/members/{v.tags[MEMBER_TAG]}/checkpoint"
        assert v.tags[CHECKPOINT_TAG] == own
    for m in ("member-0", "member-1"):
        latest = client.get_model_version_by_alias(cfg.registered_model, m)
        assert (latest.tags["iteration"], latest.tags[MEMBER_TAG]) == ("1", m)
    # the lead's evaluation is the iteration's, in both
    for i, it in enumerate(loop.iterations):
        lead = next(v for v in versions if v.tags["iteration"] == str(i))
        assert float(lead.tags["score"]) == pytest.approx(it.metrics[cfg.champion_metric])
