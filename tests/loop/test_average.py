"""The iterates as one model (`average`): after the last iteration the loop fine-tunes the
last iterate on every iteration's stored rollout (or, in Kuhn Poker, on the mixture of the
tables its evaluations read out), evaluates it against that iterate and registers it under
the alias `average`, beside the iterations' own versions."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from safetensors.torch import load_file

from sparring.cli.options import load_config, parse_params
from sparring.loop import reports, tasks
from sparring.loop.config import PipelineConfig
from sparring.loop.io import run_uri, upload
from sparring.loop.runner import run_loop
from sparring.sft import distinct_rows
from sparring.tracking import TrackingConfig, connect

ROOT = Path(__file__).resolve().parents[2]
# configs/pipeline.yaml at the smallest size that plays, trains and evaluates
TINY = ("iterations=2", "games_per_iteration=8", "game_init.num_val=2", "warm_start=null")
TINY += ("game_init.num_train=8", "game_init.num_test=0", "game.params.max_turns=2")
TINY += ("rollout.games_per_init=2", "rollout.sampling.max_new_tokens=8")
TINY += ("eval.rollout.sampling.max_new_tokens=8", "evaluate_start=false")
TINY += ("train.group_key=batch", "train.mini_batch_size=8", "train.micro_batch_size=8")
TINY += ("train.rejected_credit=penalty", "rollout.sampling.temperature=1.5")
TINY += ("eval.modes=[selfplay,vs_previous]",)
TINY += ("average={train: {steps: 2, lr: 1.0e-3, at_sampling_temperature: true, "
         "merge_duplicates: true, mini_batch_size: 64, micro_batch_size: 8}}",)  # fmt: skip


def test_the_iterates_are_distilled_evaluated_and_registered_as_average(
    tiny_model_dir, tmp_path, mlflow_db
):
    sets = (*TINY, f"model={tiny_model_dir}", f"storage.root={tmp_path / 'store'}")
    cfg = load_config(PipelineConfig, str(ROOT / "configs" / "pipeline.yaml"), parse_params(sets))
    cfg = cfg.model_copy(
        update={"tracking": TrackingConfig(tracking_uri=mlflow_db, experiment="a")}
    )
    work = tmp_path / "work"
    result = run_loop(cfg, work)

    average, last = result.average, result.iterations[-1]
    assert average.iteration == last.iteration == 1
    assert average.model_dir == work / "1" / "average" / "trained"
    # trained on both iterations' rollouts, identical rows once each
    rows = pd.concat([pd.read_parquet(work / str(i) / "rollout" / "samples.parquet")
                      for i in (0, 1)])  # fmt: skip
    assert average.metrics["train/samples"] == len(rows)
    assert average.metrics["train/distinct_samples"] == len(distinct_rows(rows)[0])
    assert average.metrics["train/optimizer_steps"] == 2
    ours, theirs = (
        load_file(average.model_dir / "model.safetensors"),
        load_file(last.model_dir / "model.safetensors"),
    )
    assert any((ours[k] != theirs[k]).any() for k in ours)  # fine-tuned from the last iterate
    assert ours.keys() == theirs.keys()  # LoRA merged: a plain checkpoint
    # evaluated on val like an iteration, its games against the last iterate
    assert cfg.champion_metric in average.metrics
    assert any(k.startswith("eval/vs_previous/") for k in average.metrics)
    store = tmp_path / "store" / result.run_name / "1"
    assert (store / "eval" / "average" / "metrics.json").exists()
    assert (store / "eval" / "metrics.json").exists()  # the iteration's own, kept
    # registered beside the iterations, under its alias
    client = connect(cfg.tracking)
    version = client.get_model_version_by_alias(cfg.registered_model, "average")
    assert str(version.version) == average.registered.version != last.registered.version
    child = client.get_model_version(cfg.registered_model, last.registered.version).run_id
    for metric in ("train/loss", cfg.champion_metric):  # the iteration's own only
        assert len(client.get_metric_history(child, metric)) == 1
    assert client.get_run(version.run_id).data.metrics["train/optimizer_steps"] == 2  # its SFT
    # the summary lists it beside the last iteration, each with its own score and version
    parent = client.get_run(child).data.tags["mlflow.parentRunId"]
    rows = {(r["iteration"], r["member"]): r for r in reports.summary_rows(cfg, parent, client)}
    assert set(rows) == {(0, None), (1, None), (1, "average")}
    for key, it in (((1, None), last), ((1, "average"), average)):
        assert str(rows[key]["version"]) == it.registered.version
        assert rows[key]["score"] == pytest.approx(it.metrics[cfg.champion_metric])
    assert average.registered.checkpoint_uri.endswith(
        f"/{result.run_name}/1/members/average/checkpoint"
    )


def test_the_tables_source_fits_the_mixture_of_the_stored_evaluations(tiny_model_dir, tmp_path):
    """`average.source: tables` reads every iteration's stored evaluation and fits the last
    iterate to the mixture of their tables: two iterations that both read out always-call
    (check, and call any bet) move the tiny model's readout onto it. A missing evaluation is
    named."""
    pytest.importorskip("pyspiel")
    from sparring.games.textarena import exploitability as kuhn
    from sparring.generation.hf import HFBackend

    sets = ("iterations=2", f"model={tiny_model_dir}", f"storage.root={tmp_path / 'store'}")
    sets += ("average={source: tables, train: {steps: 8, lr: 1.0e-2, lora_rank: 0, "
             "lr_schedule: constant, micro_batch_size: 24}}",)  # fmt: skip
    cfg = load_config(PipelineConfig, str(ROOT / "configs" / "kuhn.yaml"), parse_params(sets))
    logged = {f"eval/p_bet/{s}": row["Bet"] for s, row in kuhn.ALWAYS_CALL.items()}
    (tmp_path / "eval").mkdir()
    (tmp_path / "eval" / "metrics.json").write_text(json.dumps(logged | {"eval/x": 0.5}))
    upload(cfg, tmp_path / "eval", run_uri(cfg, "r", 0, "eval"))
    with pytest.raises(FileNotFoundError, match="iteration 1 has no stored evaluation"):
        tasks.average(cfg, str(tiny_model_dir), "r", tmp_path / "average")
    upload(cfg, tmp_path / "eval", run_uri(cfg, "r", 1, "eval"))

    metrics = tasks.average(cfg, str(tiny_model_dir), "r", tmp_path / "average")
    assert metrics["train/samples"] == 24  # both replies at each of the 12 sets

    temperature = cfg.eval.rollout.sampling.temperature

    def readout(model: Path) -> dict[str, float]:
        table = kuhn.read_policy(HFBackend(str(model)), cfg.game.make(), temperature)
        return {s: row["Bet"] for s, row in table.items()}

    before, after = readout(tiny_model_dir), readout(tmp_path / "average")
    target = {s: row["Bet"] for s, row in kuhn.ALWAYS_CALL.items()}
    assert max(abs(after[s] - target[s]) for s in target) < 0.1, after
    assert max(abs(before[s] - target[s]) for s in target) > 0.4


def test_linear_weights_scale_each_iterations_rollout_rows(tmp_path):
    """`average.weights: linear` with `source: rollouts`: the t-th iteration's rows weigh t over
    the mean weight (2/3 and 4/3 of their own weight for two iterations, so the rows weigh as
    much in all); uniform weights leave the stored rows as they are."""
    sets = (f"storage.root={tmp_path / 'store'}",)
    rows = pd.DataFrame({"input_ids": [[1, 2], [3, 4]], "weight": [1.0, 3.0]})
    for i in (0, 1):
        (tmp_path / str(i)).mkdir()
        rows.to_parquet(tmp_path / str(i) / "samples.parquet")
    for weights, scale in (("uniform", (1, 1)), ("linear", (2 / 3, 4 / 3))):
        over = (*sets, f"average={{weights: {weights}}}")
        cfg = load_config(PipelineConfig, str(ROOT / "configs" / "pipeline.yaml"),
                          parse_params(over))  # fmt: skip
        for i in (0, 1):
            upload(cfg, tmp_path / str(i), run_uri(cfg, "r", i, "rollout"))
        paths = tasks._rollout_samples(cfg, "r", [0, 1], "", tmp_path / weights)
        for path, s in zip(paths, scale, strict=True):
            got = pd.read_parquet(path)
            assert got["weight"].tolist() == pytest.approx([1.0 * s, 3.0 * s])
            assert got["input_ids"].map(list).tolist() == [[1, 2], [3, 4]]
