"""Rollout fan-out: slicing by initial state, config rules, the compiled ParallelFor, and under
kfp.local the merged rollout of 2 uneven shards equals a single-task rollout of the same seeds."""

from __future__ import annotations

import json
import uuid

import pandas as pd
import pytest
import yaml
from sparring.pipelines.local import run_kfp
from sparring.pipelines.selfplay import compile_pipeline

from sparring import storage
from sparring.loop import tasks
from sparring.loop.config import PipelineConfig
from sparring.loop.local import run_local
from sparring.loop.shards import shard_states
from sparring.tracking import connect


def sharded_config(tmp_path, shards: int, **overrides) -> PipelineConfig:
    """1 iteration of 6 games: 3 train states x 2 plays, sampled at temperature 1."""
    tag = uuid.uuid4().hex[:6]
    data = {
        "run_name": f"shards-{tag}",
        "game": {"params": {"k": 3, "max_turns": 2}},
        "iterations": 1,
        "games_per_iteration": 6,
        "device": "cpu",
        "game_init": {"num_train": 6, "num_val": 1},
        "rollout": {"games_per_init": 2, "shards": shards, "sampling": {"max_new_tokens": 8}},
        "train": {"group_key": "init"},
        "eval": {"modes": ["selfplay"], "rollout": {"sampling": {"max_new_tokens": 4}}},
        "storage": {"root": f"s3://sparring/shards-{tag}"},
        "tracking": {"tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}", "experiment": "s"},
        "registered_model": f"shards-{tag}",
    }
    return PipelineConfig.model_validate(data | overrides)


@pytest.mark.parametrize("n,shards", [(4, 3), (7, 7), (10, 4), (5, 1)])
def test_shards_are_contiguous_balanced_and_cover_every_state(n, shards):
    states = [f"s{i}" for i in range(n)]
    parts = [shard_states(states, shards, k) for k in range(shards)]
    assert sum(parts, []) == states  # in order: the merge restores the single task's order
    assert max(map(len, parts)) - min(map(len, parts)) <= 1


def test_bad_shard_requests_fail_with_the_fix(tmp_path):
    with pytest.raises(ValueError, match="exceeds the iteration's 2 initial states"):
        shard_states(["a", "b"], 3, 0)
    with pytest.raises(ValueError, match="outside 0..1"):
        shard_states(["a", "b"], 2, 2)
    with pytest.raises(ValueError, match="exceeds the 3 initial states"):
        sharded_config(tmp_path, 4)
    with pytest.raises(ValueError, match="train_backend: torch"):
        verl = {"rollout_n": 2, "train_batch_size": 2, "ppo_mini_batch_size": 2}
        sharded_config(tmp_path, 2, train_backend="verl", device="cuda", verl=verl)
    mixed = {"selfplay_fraction": 0.5, "difficulty": {"pool": ["past-1"]}}
    with pytest.raises(ValueError, match="pure self-play"):
        sharded_config(tmp_path, 2, opponents=mixed)
    with pytest.raises(ValueError, match="shardz"):
        sharded_config(tmp_path, 2, rollout={"shardz": 2})  # a typo is not silently ignored


def test_compiled_pipeline_fans_out_each_rollout(tmp_path):
    cfg = sharded_config(tmp_path, 3, iterations=2)
    cfg.kubernetes.rollout_gpus = 1
    spec, platform = yaml.safe_load_all(open(compile_pipeline(cfg, str(tmp_path / "p.yaml"))))
    body = spec["root"]["dag"]["tasks"]["exit-handler-1"]["componentRef"]["name"]
    dag = spec["components"][body]["dag"]["tasks"]
    by_name = {t["taskInfo"]["name"]: t for t in dag.values()}
    for i in range(2):
        loop = by_name[f"rollout-shards-{i}"]
        assert json.loads(loop["parameterIterator"]["items"]["raw"]) == [0, 1, 2]
        (shard,) = spec["components"][loop["componentRef"]["name"]]["dag"]["tasks"].values()
        assert shard["taskInfo"]["name"] == f"rollout-{i}-shard"
        merge = by_name[f"rollout-{i}"]
        assert merge["componentRef"]["name"].startswith("comp-merge-rollouts")
        collected = merge["inputs"]["artifacts"]["shards"]["taskOutputArtifact"]
        assert dag[collected["producerTask"]] is loop
        # train and register read the merge's samples and metrics, not a shard's
        samples = by_name[f"train-{i}"]["inputs"]["artifacts"]["samples"]["taskOutputArtifact"]
        assert by_name[f"rollout-{i}"] is dag[samples["producerTask"]]
        metrics = by_name[f"register-{i}"]["inputs"]["artifacts"]["rollout_metrics"]
        assert dag[metrics["taskOutputArtifact"]["producerTask"]] is merge
    executors = spec["deploymentSpec"]["executors"]
    gpu = executors["exec-rollout-shard"]["container"]["resources"]["accelerator"]
    assert gpu["resourceCount"] == "1"  # each shard is its own GPU pod
    assert "accelerator" not in executors["exec-merge-rollouts"]["container"].get("resources", {})
    k8s = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    assert "/dev/shm" in {m["mountPath"] for m in k8s["exec-rollout-shard"]["emptyDirMounts"]}


@pytest.fixture
def s3_env(s3_server, monkeypatch):
    for key, value in s3_server.env().items():
        monkeypatch.setenv(key, value)
    return s3_server


@pytest.mark.slow
@pytest.mark.usefixtures("mlflow_db")  # at tmp_path / "mlflow.db": sharded_config's store
def test_merged_rollout_equals_a_single_task_rollout(
    s3_env, tiny_model_dir, tmp_path, forked_tasks
):
    cfg = sharded_config(tmp_path, 2, model=str(tiny_model_dir))  # 1 + 2 states
    result = run_local(cfg, tmp_path / "runs", engine=run_kfp)
    merged = storage.download_dir(f"{result.storage_root}/0/rollout", tmp_path / "merged")
    inits = storage.download_dir(f"{result.storage_root}/inits", tmp_path / "inits")

    # the single task: the same config, model, states and seeds, in this process
    single_cfg = cfg.model_copy(update={"rollout": cfg.rollout.model_copy(update={"shards": 1})})
    stats = tasks.rollout(
        single_cfg, str(tiny_model_dir), str(inits / "train.parquet"), 0, 6, tmp_path / "one", "x"
    )
    assert (merged / "games.jsonl").read_text() == (tmp_path / "one/games.jsonl").read_text()
    pd.testing.assert_frame_equal(
        pd.read_parquet(merged / "samples.parquet"),
        pd.read_parquet(tmp_path / "one/samples.parquet"),
    )
    games = [json.loads(line) for line in (merged / "games.jsonl").read_text().splitlines()]
    assert len(games) == 6 and len({g["init_id"] for g in games}) == 3
    assert len({g["transcript"][0]["text"] for g in games}) > 1  # sampled, not all equal

    # the iteration's metrics (MLflow child run) are those of the merged data
    client = connect(cfg.tracking)
    (row,) = result.rows
    logged = client.get_run(client.get_model_version(cfg.registered_model, row["version"]).run_id)
    rollout_keys = [k for k in stats if k.startswith("rollout/")]
    assert rollout_keys and all(
        logged.data.metrics[k] == pytest.approx(stats[k]) for k in rollout_keys
    )
    assert logged.data.metrics["perf/rollout_shards"] == 2
