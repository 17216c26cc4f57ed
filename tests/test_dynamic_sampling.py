"""Dynamic sampling (DAPO) on hand-made frames: the update drops the groups without signal, the
rollout's top-up plays more states until enough groups carry signal, and the configs that
can't do either fail with the fix.

Frames come from `sample_frames.make_samples`: row i is game i // 2, state (`init`) i // 4.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from pydantic import ValidationError
from sample_frames import make_samples
from transformers import AutoTokenizer

from sparring import grpo
from sparring.loop import steps, tasks
from sparring.loop.config import PipelineConfig
from sparring.rollout import RolloutResult
from sparring.train import (
    GRPOConfig,
    advantages_for,
    collate,
    drop_silent_groups,
    load_model,
    signal_groups,
    train,
)

# state s0 (rows 0-3) has a winner and a loser; state s1 (rows 4-7) ties at 0.7
REWARDS = [1.0, 0.0, 0.5, 0.5, 0.7, 0.7, 0.7, 0.7]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def test_signal_rows_keep_every_row_of_a_group_with_a_nonzero_advantage():
    index = np.array(["a", "a", "b", "b", "c", "c"], dtype=object)
    advantages = torch.tensor(
        [
            [0.5, 0.0],  # a: signal -> both rows of a stay
            [-0.5, 0.0],
            [0.0, 0.0],  # b: all zero (a tie) -> dropped
            [0.0, 0.0],
            [0.0, 0.0],  # c: one token of one row (a rejected reply's penalty) -> c stays
            [0.0, -1.0],
        ]
    )
    assert grpo.signal_rows(index, advantages).tolist() == [1, 1, 0, 0, 1, 1]


def test_the_update_drops_tied_groups_as_if_they_were_never_played(tiny_model_dir, tokenizer):
    df = make_samples(tokenizer, REWARDS)
    cfg = GRPOConfig(group_key="init", dynamic_sampling=True)
    batch = collate(df, tokenizer.pad_token_id)
    advantages, _ = advantages_for(df, batch, cfg)  # s1's rows: exactly 0 (the tie rule)
    kept_df, kept, kept_adv, metrics = drop_silent_groups(df, batch, advantages, "init")
    assert kept_df.init.tolist() == ["s0"] * 4
    assert metrics == {"train/dropped_groups": 1.0, "train/dropped_group_frac": 0.5}
    alone = df.iloc[:4].reset_index(drop=True)  # s0 played alone
    alone_batch = collate(alone, tokenizer.pad_token_id)
    assert torch.equal(kept.input_ids, alone_batch.input_ids)
    assert torch.equal(kept_adv, advantages_for(alone, alone_batch, cfg)[0])


@pytest.mark.parametrize("dynamic", [True, False])
def test_dropping_gives_the_update_of_the_signal_groups_alone(
    tiny_model_dir, tokenizer, tmp_path, dynamic
):
    """With dynamic sampling the update on s0 + s1 is the update on s0 alone (same weights).
    Without it s1's zero-advantage rows still take part: they fill mini-batches of 4 (a second
    optimizer step) and count in seq-mean-token-mean's divisor."""
    cfg = GRPOConfig(group_key="init", lr=1e-3, mini_batch_size=4, micro_batch_size=4)
    both = tmp_path / "both.parquet"
    make_samples(tokenizer, REWARDS).to_parquet(both)
    alone = tmp_path / "alone.parquet"
    make_samples(tokenizer, REWARDS[:4]).to_parquet(alone)
    ran = train(
        tiny_model_dir,
        [both],
        tmp_path / "both",
        cfg.model_copy(update={"dynamic_sampling": dynamic}),
    )
    ref = train(tiny_model_dir, [alone], tmp_path / "alone", cfg)
    assert ran.metrics["train/dropped_groups"] == float(dynamic)
    assert ran.metrics["train/samples"] == (4 if dynamic else 8)
    assert ran.metrics["train/optimizer_steps"] == (1 if dynamic else 2)
    start, a, b = (
        load_model(p, torch.device("cpu")) for p in (tiny_model_dir, ref.out_dir, ran.out_dir)
    )
    with torch.no_grad():
        moved = [
            (y - x).abs().max() for x, y in zip(start.parameters(), a.parameters(), strict=True)
        ]
        gap = [(y - x).abs().max() for x, y in zip(a.parameters(), b.parameters(), strict=True)]
    assert max(moved) > 1e-4
    if dynamic:
        assert max(gap) < 1e-7
    else:
        assert max(gap) > 1e-5


def test_signal_groups_count_what_the_update_would_keep(tokenizer):
    cfg = GRPOConfig(group_key="init", dynamic_sampling=True)
    df = make_samples(tokenizer, REWARDS)
    assert signal_groups(df, cfg) == 1  # s0; s1 ties
    assert signal_groups(make_samples(tokenizer, [0.7] * 8), cfg) == 0  # no signal at all
    # rows the learner did not play don't count: s0's winner and loser were an opponent's
    other = df.assign(policy=["scripted", "scripted", *["policy"] * 6])
    assert signal_groups(other, cfg) == 0  # s0's rest tie at .5
    # a rejected reply's penalty is signal even in a tied group
    rejected = [list(m) for m in df.assistant_mask]
    for i in range(4):
        rejected[i] = [0] * len(rejected[i])
    penalty = cfg.model_copy(update={"rejected_credit": "penalty"})
    assert signal_groups(df.assign(rejected_mask=rejected), penalty) == 2
    per_game = cfg.model_copy(update={"group_key": "game"})
    assert signal_groups(df, per_game) == 1  # g0 = [1, 0]; g1 = [.5, .5] and s1's games tie


def fake_rollout(tokenizer, rewards_of: dict[str, float]):
    """A stand-in for `rollout.play`: each state gives 4 rows (2 games x 2 seats) whose
    rewards are `rewards_of[state]` for the first two and 0 for the other two (tie if 0)."""

    def play(states, policies, rcfg, progress=False, seat_plan=None):
        rows = []
        for init_id, _ in states:
            r = rewards_of[init_id]
            frame = make_samples(tokenizer, [r, r, 0.0, 0.0], init=[init_id] * 4)
            rows += frame.to_dict("records")
        return RolloutResult([object()] * (2 * len(states)), rows, 1.0, 1, 10)

    return play


def test_top_up_plays_rounds_until_enough_groups_carry_signal(tokenizer, monkeypatch):
    rewards_of = {"a": 1.0, "b": 0.0, "c": 0.0, "d": 1.0, "e": 1.0, "f": 1.0}  # b, c tie
    monkeypatch.setattr(steps, "play", fake_rollout(tokenizer, rewards_of))
    first = steps.play([("a", {}), ("b", {})], {}, None)  # one group with signal
    cfg = GRPOConfig(group_key="init", dynamic_sampling=True, min_groups=3, max_topup_rounds=3)
    spare = [(s, {}) for s in "cdef"]
    result, metrics = steps.TopUp(cfg, spare).play(first, 2, {}, None)
    # round 1: c (tie), d -> 2 groups; round 2: e, f -> 4 >= 3, stop
    assert metrics == {
        "rollout/signal_groups": 4.0,
        "rollout/topup_rounds": 2.0,
        "rollout/topup_games": 8.0,
    }
    assert len(result.samples) == 6 * 4 and result.generated_tokens == 10
    enough = cfg.model_copy(update={"min_groups": 1})
    _, metrics = steps.TopUp(enough, spare).play(first, 2, {}, None)
    assert metrics["rollout/topup_rounds"] == 0  # already enough
    _, metrics = steps.TopUp(cfg.model_copy(update={"min_groups": 9}), spare[:2]).play(
        first, 2, {}, None
    )
    assert metrics["rollout/topup_rounds"] == 1  # the spare states ran out


def test_topup_states_follow_the_iterations_own_without_repeats(tmp_path):
    path = tmp_path / "train.parquet"
    pd.DataFrame({"init_id": [f"s{i}" for i in range(5)], "state": ["{}"] * 5}).to_parquet(path)
    cfg = PipelineConfig.model_validate(
        {"train": {"dynamic_sampling": True, "min_groups": 2, "max_topup_rounds": 2}}
    )
    games = 2 * cfg.rollout.games_per_init  # 2 states an iteration
    assert [s for s, _ in tasks.topup_states(cfg, str(path), 0, games)] == ["s2", "s3", "s4"]
    # 2 rounds of 2 after the iteration's own, skipping those it plays (s0, s1; then s4, s0)
    assert [s for s, _ in tasks.topup_states(cfg, str(path), 2, games)] == ["s1", "s2", "s3"]


def test_configs_that_cannot_sample_dynamically_name_the_fix():
    with pytest.raises(ValidationError, match="set dynamic_sampling: false or advantage: grpo"):
        GRPOConfig(dynamic_sampling=True, advantage="rae")
    with pytest.raises(ValidationError, match="set dynamic_sampling: true or min_groups: 0"):
        GRPOConfig(min_groups=4)
    train = {"dynamic_sampling": True, "min_groups": 4}
    mix = {"selfplay_fraction": 0.5, "difficulty": {"pool": ["matching-scripted"]}}
    for override, need in [
        ({"rollout": {"shards": 2}}, "rollout.shards: 1"),
        ({"opponents": mix}, "opponents.selfplay_fraction: 1"),
    ]:
        with pytest.raises(ValidationError, match=f"needs {need}.*or set train.min_groups: 0"):
            PipelineConfig.model_validate({"train": train, **override})
    PipelineConfig.model_validate({"train": {**train, "min_groups": 0}, "rollout": {"shards": 2}})
