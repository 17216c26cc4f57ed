"""The whole self-play pipeline under kfp.local (real subprocess tasks) with the tiny model,
2 iterations, a real SeaweedFS S3 server and a real MLflow sqlite store."""

from __future__ import annotations

import pytest
from tiny_pipeline import tiny_config

from sparring import storage
from sparring.loop.local import format_summary, run_local
from sparring.tracking import connect

pytestmark = pytest.mark.slow


@pytest.fixture
def s3_env(s3_server, monkeypatch):
    for key, value in s3_server.env().items():
        monkeypatch.setenv(key, value)
    return s3_server


def test_two_iterations_end_to_end(s3_env, tiny_run):
    cfg, result = tiny_run
    client = connect(cfg.tracking)

    # the bucket holds both checkpoints, each complete per its manifest
    uris = [f"{result.storage_root}/{i}/checkpoint" for i in range(2)]  # keyed on the run id
    for uri in uris:
        entries = storage.verify(uri, deep=True)
        assert {"config.json", "model.safetensors"} <= {e.path for e in entries}
        storage.verify(uri.replace("checkpoint", "rollout"))
        storage.verify(uri.replace("checkpoint", "eval"))

    # two versions whose sources are those URIs; champion = the first: with one val game a
    # paired gain has no standard error, so no later version can show it beats the champion
    versions = sorted(
        client.search_model_versions(f"name = '{cfg.registered_model}'"),
        key=lambda v: int(v.version),
    )
    assert [v.source for v in versions] == uris
    assert [v.tags["iteration"] for v in versions] == ["0", "1"]
    best = versions[0]
    assert (
        client.get_model_version_by_alias(cfg.registered_model, "champion").version == best.version
    )
    assert result.champion.version == best.version

    # metrics per iteration: the parent's curve and each child run's rollout/train/eval metrics
    history = client.get_metric_history(result.parent_run_id, cfg.champion_metric)
    assert sorted(m.step for m in history) == [0, 1]
    assert [r["iteration"] for r in result.rows] == [0, 1]
    for row, version in zip(result.rows, versions, strict=True):
        assert row["version"] == version.version and row["checkpoint"] == version.source
        child = client.get_run(version.run_id).data.metrics
        assert {"rollout/games", "perf/train_seconds", cfg.champion_metric} <= set(child)
    assert client.get_run(result.parent_run_id).info.status == "FINISHED"
    # the compute the steps report (what bench/pipeline.py divides by the wall time)
    assert result.compute["perf/rollout_seconds"] > 0 and result.compute["perf/eval_seconds"] > 0
    evals = sum(client.get_run(v.run_id).data.metrics["perf/eval_seconds"] for v in versions)
    assert not cfg.game_init.num_test and result.compute["perf/eval_seconds"] == pytest.approx(
        evals
    )
    assert 0 < result.overhead < 1
    # each kind of task's peak memory, from the tasks' own processes (kfp.local's subprocesses)
    assert {f"perf/{t}_peak_rss_gib" for t in ("rollout", "train", "eval")} <= set(result.peaks)
    assert all(0.1 < gib < 64 for gib in result.peaks.values())  # a process that loaded torch
    summary = format_summary(result, cfg, "tiny")
    assert "peak memory by task: rollout " in summary
    assert f"champion: v{best.version} ({best.source})" in summary and uris[1] in summary
    # the game's baselines on the same val states beside the table (matching's exact deals)
    assert "random-deal" in result.rows[-1]["baselines"]
    assert f"random-deal {result.rows[-1]['baselines']['random-deal']:.3f}" in summary
    assert ("RESULT tiny_test_gain " in summary) == bool(result.test)


def test_wrong_s3_credentials_fail_clearly_and_register_nothing(s3_env, tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
    cfg = tiny_config(tmp_path, "tiny")
    with pytest.raises(RuntimeError, match="rejected access key"):
        run_local(cfg, tmp_path / "runs")
    assert connect(cfg.tracking).search_model_versions(f"name = '{cfg.registered_model}'") == []


def test_a_failed_task_marks_the_parent_run_failed(s3_env, tmp_path):
    cfg = tiny_config(tmp_path, str(tmp_path / "no-such-model"))  # initial-model fails
    with pytest.raises(RuntimeError, match="no-such-model"):
        run_local(cfg, tmp_path / "runs")
    client = connect(cfg.tracking)
    experiment = client.get_experiment_by_name(cfg.tracking.experiment)
    (parent,) = client.search_runs(
        [experiment.experiment_id], f"tags.mlflow.runName = '{cfg.run_name}'"
    )
    assert parent.info.status == "FAILED"  # the exit handler ran after the failure
    assert client.search_model_versions(f"name = '{cfg.registered_model}'") == []


def test_in_process_loop_plays_the_same_games_as_the_kfp_pipeline(s3_env, tiny_run, tmp_path):
    """`sparring run` (in-process) and `sparring run --kfp` (the compiled pipeline under
    kfp.local) are one loop: for the same config, iteration 0 plays the same games, and the
    trained model reaches the same evaluation, seed for seed. The in-process run keeps its
    files in a local folder and tracks nothing (a bench's settings); it also evaluates the
    start before any update, and scores the start and the final model on test states."""
    import json

    from sparring.loop.runner import run_loop

    kfp_cfg, kfp_result = tiny_run
    cfg = kfp_cfg.model_copy(
        update={
            "iterations": 1,
            "evaluate_start": True,
            "game_init": kfp_cfg.game_init.model_copy(update={"num_test": 3}),
            "run_name": "in-process",
            "storage": kfp_cfg.storage.model_copy(update={"root": str(tmp_path / "store")}),
            "tracking": kfp_cfg.tracking.model_copy(update={"enabled": False}),
        }
    )
    result = run_loop(cfg, tmp_path / "work")
    (it,) = result.iterations
    assert result.parent_run_id == "" and it.registered.version == ""  # nothing tracked
    assert result.test["perf/eval_seconds"] > 0  # the test's compute, which `sparring run` counts

    def games(text: str) -> list[tuple]:
        rows = [json.loads(line) for line in text.splitlines()]
        return [(g["game_id"], g["transcript"], g["rewards"]) for g in rows]

    kfp_root = f"{kfp_result.storage_root}/0"
    kfp_games = storage.read_text(f"{kfp_root}/rollout", "games.jsonl")
    here = (tmp_path / "work" / "0" / "rollout" / "games.jsonl").read_text()
    assert games(here) == games(kfp_games)
    kfp_eval = json.loads(storage.read_text(f"{kfp_root}/eval", "metrics.json"))
    evals = {k: v for k, v in it.metrics.items() if k.startswith("eval/")}
    assert evals == pytest.approx({k: v for k, v in kfp_eval.items() if k.startswith("eval/")})
    assert len(it.val_scores) == kfp_cfg.game_init.num_val  # one self-play game per val state
    # the start: the initial model on the same val games, before any update
    assert result.start.iteration == -1 and result.start.model_dir == tmp_path / "work" / "initial"
    assert result.start.val_scores.keys() == it.val_scores.keys()
    # the claim: both models once on the 3 test states, the gain paired game by game
    test = json.loads((tmp_path / "work" / "test" / "test.json").read_text())
    start, final = test["scores"]["start"], test["scores"]["final"]
    assert start.keys() == final.keys() and len(start) == 3
    assert all(game.startswith("test-") for game in start)
    diffs = [final[g] - start[g] for g in start]
    assert result.test["test/gain"] == pytest.approx(sum(diffs) / 3)
    mean = sum(diffs) / 3
    se = (sum((d - mean) ** 2 for d in diffs) / 2) ** 0.5 / 3**0.5
    assert result.test["test/gain_se"] == pytest.approx(se)
    assert result.test["test/start"] == pytest.approx(sum(start.values()) / 3)
    # beside them the game's baselines on the same test states, and the final model's margin
    trivial = [b.name for b in cfg.game.cls.baselines() if b.trivial]
    best = max(result.test[f"test/baseline/{name}"] for name in trivial)
    final_mean = sum(final.values()) / 3
    assert result.test["test/gain_over_best_trivial"] == pytest.approx(final_mean - best)
    assert test["figures"] == result.test
    # the checkpoint is stored where past-<k> opponents look for it with tracking off
    assert it.registered.checkpoint_uri == f"{tmp_path / 'store'}/{result.run_name}/0/checkpoint"
    assert result.run_name != cfg.run_name  # keyed on the run's id, not its display name
