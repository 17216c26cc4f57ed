"""The GRPO trainer end to end with the tiny model: configs, failures, direction, checkpoints."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch
from pydantic import ValidationError
from sample_frames import make_samples, mask_spans
from transformers import AutoModelForCausalLM, AutoTokenizer

from sparring import grpo
from sparring.rollout_correction import mismatch_metrics
from sparring.train import (
    GRPOConfig,
    NoSignalError,
    advantages_for,
    batched_log_probs,
    collate,
    grpo_update,
    load_model,
    prompt_groups,
    schedule,
    token_log_probs,
    train,
)

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def write(df: pd.DataFrame, tmp_path, name="samples.parquet") -> str:
    path = tmp_path / name
    df.to_parquet(path, index=False)
    return str(path)


def own_log_prob(model, batch) -> torch.Tensor:
    """Summed log-prob of each row's own tokens (B,)."""
    with torch.no_grad():
        log_prob, _ = token_log_probs(model, batch)  # (B, T-1)
    return (log_prob * batch.response_mask).sum(1)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"micro_batch_size": 16, "mini_batch_size": 8}, "lower micro_batch_size"),
        ({"loss_agg_mode": "mean"}, "unknown loss_agg_mode"),
        ({"kl_type": "full"}, "unknown kl_type"),
        ({"singleton_groups": "raw"}, "'zero' or 'batch'"),
        ({"lr": 0}, "greater than 0"),
        ({"clip_ratio": 1.5}, "less than 1"),
        ({"group_key": ""}, "column name or 'batch'"),
    ],
)
def test_bad_configs_fail_clearly(overrides, message):
    with pytest.raises(ValidationError, match=message):
        GRPOConfig(**overrides)


def test_bad_samples_fail_clearly(tiny_model_dir, tokenizer, tmp_path):
    df = make_samples(tokenizer, [1.0, 0.0, 0.5, 0.5])

    def run(df, **kw):
        return train(tiny_model_dir, [write(df, tmp_path)], tmp_path / "out", GRPOConfig(**kw))

    with pytest.raises(ValueError, match=r"lack columns \['assistant_mask'\]"):
        run(df.drop(columns="assistant_mask"))
    with pytest.raises(ValueError, match="empty"):
        run(df.iloc[:0])
    with pytest.raises(ValueError, match="policy 'policy'.*found \\['scripted'\\]"):
        run(df.assign(policy="scripted"))
    with pytest.raises(ValueError, match="not a samples column"):
        run(df, group_key="phase")
    with pytest.raises(NoSignalError, match="temperature or games_per_init.*'batch'"):
        run(df.assign(token_rewards=[[0.0] * len(x) for x in df.input_ids]))  # all rewards tie
    with pytest.raises(NoSignalError, match="size 1"):
        run(df, group_key="sample_id")  # every group is a singleton
    with pytest.raises(ValueError, match="lengths"):
        run(df.assign(assistant_mask=[m[:-1] for m in df.assistant_mask]))
    with pytest.raises(ValueError, match="only used when kl_coef > 0"):
        train(tiny_model_dir, [write(df, tmp_path)], tmp_path / "o", None, tiny_model_dir)
    with pytest.raises(ValueError, match="top_p < 1"):
        run(df.assign(temperature=0.7, top_p=0.9))
    with pytest.raises(ValueError, match="greedily"):
        run(df.assign(temperature=0.0, top_p=1.0))


def test_collate_carries_each_rows_sampling_temperature(tokenizer):
    """The rollout's `temperature` column reaches the batch; scripted rows (NaN) and samples
    without the column are scored at 1."""
    df = make_samples(tokenizer, [1.0, 0.0, 0.5, 0.5])
    assert collate(df, tokenizer.pad_token_id).temperature.tolist() == [1.0] * 4
    df["temperature"] = [0.7, 0.7, float("nan"), 1.3]
    got = collate(df, tokenizer.pad_token_id).temperature
    torch.testing.assert_close(got, torch.tensor([0.7, 0.7, 1.0, 1.3]))


def test_one_step_widens_the_gap_between_positive_and_negative_log_prob(tiny_model_dir, tokenizer):
    # rows 0 and 2 reply with different text (no shared reply), one group: A = +.7071, -.7071
    df = make_samples(tokenizer, [1.0, 0.0, 0.0]).iloc[[0, 2]].reset_index(drop=True)
    cfg = GRPOConfig(group_key="batch", lr=1e-3, mini_batch_size=2, micro_batch_size=1)
    batch = collate(df, tokenizer.pad_token_id)
    advantages, _ = advantages_for(df, batch, cfg)
    model = load_model(tiny_model_dir, CPU)
    before = own_log_prob(model, batch)
    metrics = grpo_update(model, batch, advantages, cfg, CPU)
    after = own_log_prob(model, batch)
    # The positive reply gains and the gap to the negative one widens. Both replies share every
    # parameter, so the negative reply may still drift up a little (with this tokenizer it
    # moves by under 1 nat while the positive one gains 9): only the gap is guaranteed.
    assert after[0] > before[0]
    assert after[0] - before[0] > after[1] - before[1]
    # on-policy step: the old log-probs came from the same forward, so the ratio is exactly 1
    assert metrics["train/ppo_kl"] == 0 and metrics["train/pg_clipfrac"] == 0


def test_precomputed_old_log_probs_match_the_training_forward(tiny_model_dir, tokenizer):
    # Rows outside the first mini-batch get old log-probs from a separate no-grad pass; with a
    # vanishing lr the weights stay put, so any ratio != 1 would be a data-path mismatch.
    df = make_samples(tokenizer, [1.0, 0.0, 0.3, 0.6, 0.9, 0.1])
    cfg = GRPOConfig(group_key="batch", lr=1e-12, mini_batch_size=2, micro_batch_size=2)
    batch = collate(df, tokenizer.pad_token_id)
    advantages, _ = advantages_for(df, batch, cfg)
    metrics = grpo_update(load_model(tiny_model_dir, CPU), batch, advantages, cfg, CPU)
    assert abs(metrics["train/ppo_kl"]) < 1e-6 and metrics["train/optimizer_steps"] == 3


def test_gradient_accumulation_matches_one_big_micro_batch(tiny_model_dir, tokenizer):
    # One mini-batch of 4 rows of different lengths, as 1 micro-batch or as 4: the accumulated
    # gradient (left in .grad after the step) is the same.
    df = make_samples(tokenizer, [1.0, 0.0, 0.3, 0.6])
    batch = collate(df, tokenizer.pad_token_id)
    grads = []
    for micro in (4, 2, 1):
        cfg = GRPOConfig(group_key="batch", mini_batch_size=4, micro_batch_size=micro)
        model = load_model(tiny_model_dir, CPU)
        grpo_update(model, batch, advantages_for(df, batch, cfg)[0], cfg, CPU)
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    assert all(torch.allclose(grads[0], g, atol=1e-6) for g in grads[1:])
    assert grads[0].abs().sum() > 0


def test_micro_batches_group_rows_of_similar_length(tiny_model_dir, tokenizer):
    """Each row once, longest first, so a chunk pads to its own longest: fewer padded tokens
    than the given order; batched log-probs come back in the order the rows were asked in."""
    df = make_samples(tokenizer, [1.0, 0.0, 0.3, 0.6, 0.9, 0.1])
    batch = collate(df, tokenizer.pad_token_id)
    lengths = batch.attention_mask.sum(1).tolist()
    assert len(set(lengths)) > 2  # rows of different lengths, or nothing to sort
    rows = [0, 1, 2, 3, 4, 5]
    chunks = list(batch.micro_batches(rows, 2))
    assert sorted(r for c in chunks for r in c) == rows
    flat = [lengths[r] for c in chunks for r in c]
    assert flat == sorted(flat, reverse=True)

    def padded(chunked):
        return sum(max(lengths[r] for r in c) * len(c) for c in chunked)

    given = [rows[i : i + 2] for i in range(0, 6, 2)]
    assert padded(chunks) <= padded(given)
    assert list(batch.micro_batches(rows, 2, by_length=False)) == given  # the transfer loss's
    model = load_model(tiny_model_dir, CPU)
    cfg = GRPOConfig(mini_batch_size=2, micro_batch_size=2)
    asked = [3, 0, 5]
    got = batched_log_probs(model, batch, asked, cfg, CPU)  # (3, T-1)
    for line, row in enumerate(asked):
        one = batch.select([row])
        want, _ = token_log_probs(model, one)
        torch.testing.assert_close(got[line, : want.shape[1]], want[0], atol=1e-5, rtol=0)


def test_checkpoint_loads_back_with_metrics(tiny_model_dir, tokenizer, tmp_path):
    df = make_samples(tokenizer, [1.0, 0.0, 0.2, 0.8, 0.5, 0.5, 0.1, 0.9])
    cfg = GRPOConfig(
        lr=1e-3,
        epochs=2,
        mini_batch_size=4,
        micro_batch_size=2,
        kl_coef=0.05,
        entropy_coef=0.01,
        loss_agg_mode="seq-mean-token-mean",
    )
    stats = train(tiny_model_dir, [write(df, tmp_path)], tmp_path / "ckpt", cfg, tiny_model_dir)
    out = stats.out_dir
    assert (out / "model.safetensors").exists() and (out / "tokenizer.json").exists()
    metrics = json.loads((out / "metrics.json").read_text())
    for key in (
        "train/loss",
        "train/pg_clipfrac",
        "train/kl",
        "train/entropy",
        "train/grad_norm",
        "train/lr",
        "perf/train_tokens_per_second",
        "train/init/adv_std",
        "train/game/frac_reward_zero_std",
        "train/role/num_groups",
        "train/batch/adv_mean",
        "train/frac_reward_zero_std",
    ):
        assert key in metrics and metrics[key] == metrics[key], key  # present and not NaN
    assert metrics["train/optimizer_steps"] == 4 and metrics["train/kl"] > 0
    model = AutoModelForCausalLM.from_pretrained(out)
    start = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert AutoTokenizer.from_pretrained(out).encode("[accept]") == tokenizer.encode("[accept]")
    changed = [
        not torch.equal(a, b) for a, b in zip(model.parameters(), start.parameters(), strict=True)
    ]
    assert any(changed)


def test_rollout_samples_train_and_the_checkpoint_plays(tiny_model_dir, tmp_path):
    """Real rollout samples in, a checkpoint out that the rollout plays with again."""
    from sparring.game_init import GameInitConfig, write_inits
    from sparring.generation.base import SamplingParams
    from sparring.generation.hf import HFBackend
    from sparring.rollout import RolloutConfig, load_inits, play, write_outputs

    game = {"k": 3, "max_turns": 2}
    inits = load_inits(
        write_inits(
            GameInitConfig(game={"params": game}, num_train=1, num_val=1), tmp_path / "inits"
        )["train"]
    )
    rcfg = RolloutConfig(
        game={"params": game},
        games_per_init=2,
        sampling=SamplingParams(temperature=1.0, max_new_tokens=8, seed=0),
    )
    samples = write_outputs(
        play(inits, {"policy": HFBackend(str(tiny_model_dir), device="cpu")}, rcfg, progress=False),
        tmp_path / "r0",
    )["samples"]
    df = pd.read_parquet(samples)
    assert (df.temperature == 1.0).all() and (df.top_p == 1.0).all()  # what the trainer scores
    # a random model rarely agrees, so give the seats of game 0 a win to learn from
    df["token_rewards"] = [
        [0.0] * (len(r) - 1) + [float(g == df.game[0])]
        for r, g in zip(df.token_rewards, df.game, strict=True)
    ]
    stats = train(
        tiny_model_dir,
        [write(df, tmp_path)],
        tmp_path / "m1",
        GRPOConfig(group_key="init", lr=1e-3, mini_batch_size=4, micro_batch_size=4),
    )
    again = play(
        inits, {"policy": HFBackend(str(stats.out_dir), device="cpu")}, rcfg, progress=False
    )
    assert len(again.episodes) == 2


# ---- rollout log-probs: the mismatch and its corrections --------------------------------------
@pytest.fixture(scope="module")
def engine_samples(tiny_model_dir, tmp_path_factory) -> pd.DataFrame:
    """Samples of a real rollout of the tiny model at temperature 0.7 (2 games, 2 seats), with
    the seats of game 0 given a win so that there is something to learn."""
    from sparring.game_init import GameInitConfig, write_inits
    from sparring.generation.base import SamplingParams
    from sparring.generation.hf import HFBackend
    from sparring.rollout import RolloutConfig, load_inits, play, write_outputs

    out = tmp_path_factory.mktemp("engine-samples")
    game = {"k": 3, "max_turns": 2}
    inits = load_inits(
        write_inits(GameInitConfig(game={"params": game}, num_train=1), out / "inits")["train"]
    )
    rcfg = RolloutConfig(
        game={"params": game},
        games_per_init=2,
        sampling=SamplingParams(temperature=0.7, max_new_tokens=12, seed=0),
    )
    engine = HFBackend(str(tiny_model_dir), device="cpu")
    samples = write_outputs(play(inits, {"policy": engine}, rcfg, progress=False), out / "r")
    df = pd.read_parquet(samples["samples"])
    df["token_rewards"] = [
        [0.0] * (len(r) - 1) + [float(g == df.game[0])]
        for r, g in zip(df.token_rewards, df.game, strict=True)
    ]
    return df


def update(tiny_model_dir, df, tokenizer, **overrides):
    """One grpo_update in 2 mini-batches (old log-probs from the separate pass and from the
    first step's forward): (model, metrics, each step's metrics)."""
    cfg = GRPOConfig(group_key="batch", lr=1e-3, mini_batch_size=2, micro_batch_size=2, **overrides)
    batch = collate(df, tokenizer.pad_token_id)
    model, steps = load_model(tiny_model_dir, CPU), []
    advantages = advantages_for(df, batch, cfg)[0]
    metrics = grpo_update(model, batch, advantages, cfg, CPU, on_step=lambda i, m: steps.append(m))
    return model, metrics, steps


def max_gap(a: torch.nn.Module, b: torch.nn.Module) -> float:
    with torch.no_grad():
        pairs = zip(a.parameters(), b.parameters(), strict=True)
        return max(float((x - y).abs().max()) for x, y in pairs)


def l2_gap(a: torch.nn.Module, b: torch.nn.Module) -> float:
    """The L2 norm of all the weights' differences."""
    with torch.no_grad():
        pairs = zip(a.parameters(), b.parameters(), strict=True)
        return float(sum(((x - y) ** 2).sum() for x, y in pairs) ** 0.5)


def test_engine_log_probs_equal_the_trainers_old_log_probs(
    tiny_model_dir, engine_samples, tokenizer
):
    """The CPU engine's log-probs of its sampled tokens at T=0.7 are the trainer's recomputed
    ones (measured: max |diff| 1.4e-6, mismatch_kl ~1e-13); a rollout sampled at 0.7 but
    declared at 1 is detected (mismatch_kl ~5e-3 on this random model)."""
    df = engine_samples
    assert (df.temperature == 0.7).all() and len(df) == 4
    assert all(len(x) == len(lp) for x, lp in zip(df.input_ids, df.rollout_log_probs, strict=True))
    model = load_model(tiny_model_dir, CPU, trainable=False)
    for declared, bound in [(0.7, (0, 1e-9)), (1.0, (1e-3, 1))]:
        batch = collate(df.assign(temperature=declared), tokenizer.pad_token_id)
        old = batched_log_probs(model, batch, range(4), GRPOConfig(), CPU)  # (B, T-1)
        got = mismatch_metrics(old, batch.rollout_log_prob, batch.response_mask)
        assert bound[0] <= got["mismatch_kl"] < bound[1], (declared, got)
        if declared == 0.7:
            on = batch.response_mask.bool()
            assert (old - batch.rollout_log_prob)[on].abs().max() < 1e-5
            assert got["mismatch_frac_out"] == 0


def same_update(tiny_model_dir, df, tokenizer, **overrides) -> tuple[dict, dict]:
    """Assert that the update with `overrides` is the plain one: every step's loss and gradient
    norm to 1e-5 (relative), the weights in norm to 1e-3 of the update's size; returns both
    updates' metrics."""
    plain, metrics, steps = update(tiny_model_dir, df, tokenizer)
    other, other_metrics, other_steps = update(tiny_model_dir, df, tokenizer, **overrides)
    for a, b in zip(steps, other_steps, strict=True):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5, abs=1e-7)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-5)
    assert l2_gap(plain, other) < 1e-3 * l2_gap(plain, load_model(tiny_model_dir, CPU))
    return metrics, other_metrics


def test_bypass_gives_the_recompute_update_when_they_agree(
    tiny_model_dir, engine_samples, tokenizer
):
    """Old log-probs from the engine instead of the trainer's pass: every step's loss and
    gradient norm agree to 1e-5 (relative), and so do the weights, in norm (measured: the two
    updates 3.6e-5 of their size apart). Not element by element: AdamW's first steps move a
    weight by about lr whatever its gradient's size, so a gradient near 0 whose sign rounds
    differently moves it the other way (measured on an AMD EPYC: 2% of the largest move)."""
    metrics, bypassed = same_update(tiny_model_dir, engine_samples, tokenizer, bypass_mode=True)
    assert metrics["train/mismatch_kl"] < 1e-9 and metrics["train/mismatch_frac_out"] == 0
    assert bypassed["train/mismatch_kl"] < 1e-9  # bypass: on the first mini-batch's rows
    # the update's time counts the trainer's old-log-prob pass, which bypass skips
    assert 0 < metrics["perf/log_prob_pass_seconds"] < metrics["perf/train_seconds"]
    assert bypassed["perf/log_prob_pass_seconds"] < metrics["perf/log_prob_pass_seconds"] / 10


def test_shared_prefixes_give_the_plain_update(tiny_model_dir, engine_samples, tokenizer):
    """share_prefix packs each seat's rows of a game state behind their shared prompt, in the
    old-log-prob pass and in every step: the same losses, gradient norms and weights (to float
    rounding); with mini_batches: prompts each step holds one whole prompt group."""
    _, metrics = same_update(tiny_model_dir, engine_samples, tokenizer, share_prefix=True)
    assert metrics["train/mismatch_kl"] < 1e-9
    df = engine_samples
    cfg = GRPOConfig(mini_batch_size=2, micro_batch_size=2, mini_batches="prompts")
    prompts = prompt_groups(df).tolist()
    assert sorted(prompts) == [0, 0, 1, 1]  # 2 games of one state, 2 seats
    for mini in schedule(len(df), cfg, prompts=prompts):
        assert prompts[mini[0]] == prompts[mini[1]]


def test_truncated_importance_sampling_weights_a_mismatched_update(
    tiny_model_dir, engine_samples, tokenizer
):
    """Sampled at 0.7, declared 1: the mismatch shows, and TIS's weights pi_old / pi_rollout
    (not 1) move the update. Where the two agree the weights are 1 (by hand:
    tests/test_rollout_correction.py)."""
    off = engine_samples.assign(temperature=1.0)
    plain, metrics, _ = update(tiny_model_dir, off, tokenizer)
    tis, weighted, _ = update(tiny_model_dir, off, tokenizer, rollout_is="token")
    assert metrics["train/mismatch_kl"] > 1e-3 and "train/rollout_is_mean" not in metrics
    assert abs(weighted["train/rollout_is_mean"] - 1) > 1e-3  # measured: 1.009
    assert max_gap(plain, tis) > 1e-5


def test_state_balance_is_the_plain_update_with_each_replys_advantage_weighted(
    tiny_model_dir, tokenizer
):
    """`state_balance: 1` trains exactly as the plain update whose advantages are multiplied
    token by token by the decision states' weights (the weights' arithmetic is worked by hand
    in tests/test_grpo.py). The rows of `make_samples` first reply after one of two prompts
    (by seat: 2 visits each) and then after prompts of their own (1 visit each), so the first
    replies weigh 2/3 and the second 4/3. Two mini-batches: the weights follow their rows."""
    df = make_samples(tokenizer, [1.0, 0.0, 0.3, 0.6])
    batch = collate(df, tokenizer.pad_token_id)
    cfg = GRPOConfig(group_key="batch", lr=1e-3, mini_batch_size=2, micro_batch_size=1)
    advantages = advantages_for(df, batch, cfg)[0]  # (B, T-1)
    weights, _ = grpo.state_weights(batch.input_ids, batch.response_mask, 1.0)
    for row in weights:
        first, second = [row[a:b] for a, b in mask_spans(row.gt(0).int().tolist())]
        assert (first == 2 / 3).all() and (second == 4 / 3).all()
    runs = []
    for balance, adv in [(1.0, advantages), (0.0, advantages * weights)]:
        model, steps = load_model(tiny_model_dir, CPU), []
        metrics = grpo_update(
            model,
            batch,
            adv,
            cfg.model_copy(update={"state_balance": balance}),
            CPU,
            on_step=lambda i, m, steps=steps: steps.append(m),
        )
        runs.append((model, metrics, steps))
    (balanced, metrics, steps), (weighted, plain_metrics, plain_steps) = runs
    for a, b in zip(steps, plain_steps, strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5, abs=1e-7)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-5)
    assert l2_gap(balanced, weighted) < 1e-3 * l2_gap(weighted, load_model(tiny_model_dir, CPU))
    assert metrics["train/decision_states"] == 6 and metrics["train/state_visits_min"] == 1
    assert "train/decision_states" not in plain_metrics  # off: the plain update, no weights


def test_rollout_corrections_need_rollout_log_probs(tiny_model_dir, tokenizer, engine_samples):
    with pytest.raises(ValidationError, match="set rollout_is: null or bypass_mode: false"):
        GRPOConfig(rollout_is="token", bypass_mode=True)
    scripted = make_samples(tokenizer, [1.0, 0.0, 0.5, 0.5])  # no rollout_log_probs column
    with pytest.raises(ValueError, match="bypass_mode needs the rollout's log-probs.*4 of 4"):
        update(tiny_model_dir, scripted, tokenizer, bypass_mode=True)
    _, metrics, _ = update(tiny_model_dir, scripted, tokenizer)
    assert "train/mismatch_kl" not in metrics  # nothing to compare: not measured, not 0
    cut = [lp[:-1] for lp in engine_samples.rollout_log_probs]
    with pytest.raises(ValueError, match="rollout_log_probs has .* entries for"):
        collate(engine_samples.assign(rollout_log_probs=cut), tokenizer.pad_token_id)
    mixed = engine_samples.copy()  # a row without them (a scripted seat): measured without it
    mixed["rollout_log_probs"] = [None, *mixed.rollout_log_probs[1:]]
    assert collate(mixed, tokenizer.pad_token_id).scored.tolist() == [False, True, True, True]
    with pytest.raises(ValueError, match="rollout_is needs the rollout's log-probs.*1 of 4"):
        update(tiny_model_dir, mixed, tokenizer, rollout_is="token")


# ---- balance_by: mini-batches with equal rows per label ------------------------------------
COUNTRIES = ["AUS", "ENG", "FRA", "GER", "ITA", "RUS", "TUR"]


def counts(mini: list[int], labels: list[str]) -> dict[str, int]:
    found = {label: 0 for label in set(labels)}
    for i in mini:
        found[labels[i]] += 1
    return found


@pytest.mark.parametrize("mini_batch_size", [14, 10, 7, 3])
def test_balanced_schedule_gives_each_label_its_share_of_every_mini_batch(mini_batch_size):
    # 7 labels x 8 rows, shuffled: with 14 rows a step every label has exactly 2; with 10 (or
    # 3) the counts differ by at most one
    labels = [
        COUNTRIES[i % 7] for i in torch.randperm(56, generator=torch.Generator().manual_seed(3))
    ]
    cfg = GRPOConfig(epochs=2, mini_batch_size=mini_batch_size, micro_batch_size=1, seed=5)
    plan = schedule(56, cfg, labels)
    per_epoch = len(plan) // 2
    for mini in plan:
        got = counts(mini, labels).values()
        assert max(got) - min(got) <= 1
        if mini_batch_size == 14:
            assert set(got) == {2}
    for epoch in (plan[:per_epoch], plan[per_epoch:]):  # every row once per epoch
        assert sorted(i for mini in epoch for i in mini) == list(range(56))
    assert plan[:per_epoch] != plan[per_epoch:]  # each epoch its own order
    assert schedule(56, cfg, labels) == plan  # deterministic with the seed
    assert schedule(56, cfg.model_copy(update={"seed": 6}), labels) != plan


def test_balanced_schedule_with_unequal_labels_uses_every_row_once():
    # A has 6 rows, B 2: the first mini-batch of 4 is 2 + 2; then only A is left
    labels = ["A"] * 6 + ["B"] * 2
    cfg = GRPOConfig(mini_batch_size=4, micro_batch_size=1)
    plan = schedule(8, cfg, labels)
    assert counts(plan[0], labels) == {"A": 2, "B": 2} and counts(plan[1], labels) == {
        "A": 4,
        "B": 0,
    }
    assert sorted(plan[0] + plan[1]) == list(range(8))
    with pytest.raises(ValueError, match="3 labels for 8 rows"):
        schedule(8, cfg, ["A"] * 3)


def test_balance_by_trains_end_to_end_and_names_a_missing_column(
    tiny_model_dir, tokenizer, tmp_path
):
    df = make_samples(tokenizer, [1.0, 0.0, 0.2, 0.8, 0.5, 0.4, 0.1, 0.9])
    cfg = GRPOConfig(group_key="batch", balance_by="role", mini_batch_size=4, micro_batch_size=2)
    steps: list[dict] = []
    train(
        tiny_model_dir,
        [write(df, tmp_path)],
        tmp_path / "ckpt",
        cfg,
        on_step=lambda i, m: steps.append(m),
    )
    assert len(steps) == 2
    with pytest.raises(ValueError, match="balance_by 'country' is not a samples column"):
        bad = cfg.model_copy(update={"balance_by": "country"})
        train(tiny_model_dir, [write(df, tmp_path)], tmp_path / "ckpt2", bad)
    with pytest.raises(ValidationError, match="must name a samples column"):
        GRPOConfig(balance_by="batch")


def test_a_pipeline_config_checks_balance_by_against_the_games_columns():
    from sparring.loop.config import PipelineConfig

    cfg = PipelineConfig.model_validate({"train": {"balance_by": "role"}})
    assert cfg.train.balance_by == "role"
    with pytest.raises(ValidationError, match="unknown group key 'colour'"):
        PipelineConfig.model_validate({"train": {"balance_by": "colour"}})
    with pytest.raises(ValidationError, match="set train_backend: torch or balance_by: null"):
        PipelineConfig.model_validate({"train": {"balance_by": "role"}, "train_backend": "verl"})


def test_state_balance_is_checked_for_its_range_and_route():
    from sparring.loop.config import PipelineConfig

    with pytest.raises(ValidationError, match="less than or equal to 1"):
        GRPOConfig(state_balance=1.5)
    assert PipelineConfig.model_validate({"train": {"state_balance": 1}}).train.state_balance == 1
    with pytest.raises(ValidationError, match="set train_backend: torch or state_balance: 0"):
        PipelineConfig.model_validate({"train": {"state_balance": 1}, "train_backend": "verl"})
