"""Cross-country transfer on Diplomacy: the seed's default pairs, and a real GRPO step on the
tiny model's own Diplomacy samples with the transfer loss on."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

pytest.importorskip("diplomacy")

from sparring.games.diplomacy import DiplomacyGame  # noqa: E402
from sparring.generation.base import SamplingParams  # noqa: E402
from sparring.generation.hf import HFBackend  # noqa: E402
from sparring.loop.config import PipelineConfig  # noqa: E402
from sparring.rollout import RolloutConfig, play  # noqa: E402
from sparring.samples import write_samples  # noqa: E402
from sparring.train import GRPOConfig, train  # noqa: E402

SEED_PAIRS = [("AUSTRIA", "ITALY"), ("ENGLAND", "RUSSIA"), ("FRANCE", "GERMANY")]


def test_a_diplomacy_recipe_defaults_to_the_seeds_pairs():
    def recipe(**train):
        return PipelineConfig.model_validate({"game": "diplomacy", "train": train})

    assert list(DiplomacyGame.transfer_pairs) == SEED_PAIRS
    assert recipe(transfer_weight=0.1).train.transfer_pairs == SEED_PAIRS
    own = recipe(transfer_weight=0.1, transfer_pairs=[["TURKEY", "RUSSIA"]])
    assert own.train.transfer_pairs == [("TURKEY", "RUSSIA")]
    with pytest.raises(ValidationError, match=r"names \['Austria'\], not roles of diplomacy"):
        recipe(transfer_weight=0.1, transfer_pairs=[["Austria", "ITALY"]])


def test_a_grpo_step_on_the_tiny_models_diplomacy_samples_logs_the_transfer_loss(
    tiny_model_dir, tmp_path
):
    game = {"name": "diplomacy", "params": {"horizon": 1, "press": False}}
    state = DiplomacyGame(horizon=1, press=False).generate_state(2)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=16, seed=0)
    rcfg = RolloutConfig(game=game, sampling=sampling, games_per_init=2)
    policy = HFBackend(str(tiny_model_dir), device="cpu")
    res = play([("d2", state)], {"policy": policy}, rcfg, progress=False)
    samples = write_samples(res.samples, tmp_path / "samples.parquet")  # 2 games x 7 powers
    cfg = GRPOConfig(
        group_key="batch",  # two games: the seven powers' rewards differ
        mini_batch_size=14,
        micro_batch_size=7,
        transfer_weight=0.1,
        transfer_pairs=SEED_PAIRS,
    )
    stats = train(tiny_model_dir, [str(samples)], tmp_path / "out", cfg)
    metrics = json.loads((stats.out_dir / "metrics.json").read_text())
    assert metrics["train/transfer_loss"] > 0
    assert 0 < metrics["train/transfer_share"] < 1
    assert 1 <= metrics["train/transfer_pairs"] <= 3  # the pairs in each micro-batch of 7


def test_transfer_ablation_bench(bench, tiny_model_dir, tmp_path):
    """bench/transfer_ablation.py at smoke size: a shared warm start, one seed of weights 0
    and 1 through the product loop (one self-play game: the seven powers' samples, all three
    pairs in one GRPO step), each country's final evaluation against greedy, the weaker power
    of each pair and its gain; RESULT last."""
    sets = (f"model={tiny_model_dir}", "iterations=1", "game_init.num_train=1")
    sets += ("game_init.num_val=1", "rollout.games_per_init=1", "games_per_iteration=1")
    sets += ("warm_start.num_states=1", "warm_start.train.epochs=1", "train.mini_batch_size=7")
    sets += ("train.micro_batch_size=7", "train.group_key=batch")
    sets += ("rollout.sampling.max_new_tokens=8", "eval.rollout.sampling.max_new_tokens=8")
    sets += ("eval.breakdown=false",)  # greedy alone: the games the bench reads
    args = [arg for pair in sets for arg in ("--set", pair)]
    lines = bench.output(
        "transfer_ablation.py", *args, "--weights", "0", "1", "--seeds", "0", "--out", str(tmp_path)
    )
    saved = json.loads((tmp_path / "transfer_ablation.json").read_text())
    assert [(r["weight"], r["seed"]) for r in saved["runs"]] == [(0.0, 0), (1.0, 0)]
    off, on = saved["runs"]
    assert off["transfer_loss"] is None and on["transfer_loss"] > 0  # logged only when on
    for run in saved["runs"]:  # 1 val state: each country once against greedy
        assert all(len(c["rewards"]) == 1 for c in run["countries"].values())
    assert all(w in pair for pair, w in zip(SEED_PAIRS, saved["weaker"], strict=True))
    gains = saved["gains"]["1.0"]
    assert set(gains) == set(saved["weaker"])
    name, value = lines[-1].split()[1:]
    mean = sum(g["mean"] for g in gains.values()) / 3
    assert name == "transfer_weaker_gain" and float(value) == pytest.approx(mean, abs=5e-5)
