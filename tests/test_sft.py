"""SFT warm start: loss only on the seat's own tokens, through the trainer's data path."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from sample_frames import make_samples
from transformers import AutoModelForCausalLM, AutoTokenizer

from sparring import grpo
from sparring.sft import sft, sft_loss
from sparring.train import collate, load_model, token_log_probs
from sparring.train_config import SFTConfig


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def test_sft_loss_ignores_tokens_outside_the_assistant_mask(tokenizer):
    batch = collate(make_samples(tokenizer, [0.0, 1.0]), tokenizer.pad_token_id)
    b, t = batch.input_ids.shape
    logits = torch.randn(b, t, len(tokenizer), requires_grad=True)  # (B, T, V)
    model = lambda **kw: SimpleNamespace(logits=logits)  # noqa: E731  (a fixed "model")
    config = grpo.actor_config(0.2, None, "token-mean")
    grpo.set_global_batch(config, batch.response_mask)
    loss, _ = sft_loss(model, batch, [0, 1], config)
    loss.backward()
    # logits at t predict token t+1: they matter only where response_mask[:, t] is 1
    masked = batch.response_mask == 0  # (B, T-1)
    assert (logits.grad[:, :-1][masked] == 0).all() and (logits.grad[:, -1] == 0).all()
    assert (logits.grad[:, :-1][~masked] != 0).any()


def test_sft_learns_the_replies_and_saves_a_checkpoint(tiny_model_dir, tokenizer, tmp_path):
    df = make_samples(tokenizer, [0.0] * 4).assign(policy="matching-scripted")
    df.to_parquet(tmp_path / "scripted.parquet")
    cfg = SFTConfig(lr=3e-3, epochs=3, mini_batch_size=4, micro_batch_size=2)
    stats = sft(tiny_model_dir, [tmp_path / "scripted.parquet"], tmp_path / "sft", cfg)
    batch = collate(df, tokenizer.pad_token_id)

    def nll(model) -> float:
        with torch.no_grad():
            log_prob, _ = token_log_probs(model, batch)  # (B, T-1)
        return float(-(log_prob * batch.response_mask).sum() / batch.response_mask.sum())

    before = nll(load_model(tiny_model_dir, torch.device("cpu")))
    after = nll(AutoModelForCausalLM.from_pretrained(stats.out_dir))
    assert after < before - 0.5  # every row trained although none was played by "policy"
    metrics = json.loads((stats.out_dir / "metrics.json").read_text())
    assert metrics["train/optimizer_steps"] == 3 and metrics["train/samples"] == 4
    assert AutoTokenizer.from_pretrained(stats.out_dir).eos_token == "<|im_end|>"


def _trained(tiny_model_dir, df, tmp_path, name, **cfg) -> tuple[dict, dict[str, float]]:
    """The weights and metrics of two full-batch SFT steps on `df`."""
    df.to_parquet(tmp_path / f"{name}.parquet")
    cfg = SFTConfig(lr=1e-2, steps=2, mini_batch_size=8, micro_batch_size=2, **cfg)
    stats = sft(tiny_model_dir, [tmp_path / f"{name}.parquet"], tmp_path / name, cfg)
    return AutoModelForCausalLM.from_pretrained(stats.out_dir).state_dict(), stats.metrics


def test_merged_duplicates_train_as_the_copies_they_stand_for(tiny_model_dir, tokenizer, tmp_path):
    two = make_samples(tokenizer, [0.0, 1.0])
    copies = two.iloc[[0, 0, 0, 1]].reset_index(drop=True)  # row 0 three times
    plain, plain_m = _trained(tiny_model_dir, copies, tmp_path, "copies")
    merged, merged_m = _trained(tiny_model_dir, copies, tmp_path, "merged", merge_duplicates=True)
    once, once_m = _trained(tiny_model_dir, two, tmp_path, "once")  # the copies' weight lost
    weighted, weighted_m = _trained(tiny_model_dir, two.assign(weight=[3.0, 1.0]), tmp_path, "w")
    assert (merged_m["train/distinct_samples"], plain_m["train/distinct_samples"]) == (2, 4)
    assert merged_m["train/samples"] == plain_m["train/samples"] == 4
    for metric in ("train/loss", "train/nll", "train/grad_norm"):  # the same loss, step by step
        assert merged_m[metric] == pytest.approx(plain_m[metric], rel=1e-5)
        assert weighted_m[metric] == pytest.approx(plain_m[metric], rel=1e-5)
        assert once_m[metric] != pytest.approx(plain_m[metric], rel=1e-3)

    def gap(a: dict) -> float:
        return max(float((a[k] - plain[k]).abs().max()) for k in plain)

    # Adam's first step amplifies rounding, not this much
    assert max(gap(merged), gap(weighted)) < gap(once) / 10


def test_a_weight_column_is_checked(tiny_model_dir, tokenizer, tmp_path):
    """Weights a loss would cancel, or that are no weights, are refused before training."""
    two = make_samples(tokenizer, [0.0, 1.0])
    with pytest.raises(ValueError, match="weigh their rows.*token-mean"):
        _trained(tiny_model_dir, two.assign(weight=1.0), tmp_path, "seq",
                 loss_agg_mode="seq-mean-token-mean")  # fmt: skip
    with pytest.raises(ValueError, match="negative or non-finite weight"):
        _trained(tiny_model_dir, two.assign(weight=[1.0, -1.0]), tmp_path, "negative")


def test_at_sampling_temperature_scores_each_row_at_its_temperature(tiny_model_dir, tokenizer,
                                                                    tmp_path):  # fmt: skip
    df = make_samples(tokenizer, [0.0, 1.0]).assign(temperature=2.0, top_p=1.0)
    model = load_model(tiny_model_dir, torch.device("cpu"))

    def nll(temperature: float) -> float:
        batch = collate(df.assign(temperature=temperature), tokenizer.pad_token_id)
        with torch.no_grad():
            log_prob, _ = token_log_probs(model, batch)  # (B, T-1)
        return float(-(log_prob * batch.response_mask).sum() / batch.response_mask.sum())

    for at_temperature, expected in ((True, nll(2.0)), (False, nll(1.0))):
        name = f"at-{at_temperature}"
        cfg = {"at_sampling_temperature": at_temperature, "steps": 1}
        df.to_parquet(tmp_path / f"{name}.parquet")
        stats = sft(tiny_model_dir, [tmp_path / f"{name}.parquet"], tmp_path / name,
                    SFTConfig(lr=1e-9, mini_batch_size=2, micro_batch_size=2, **cfg))  # fmt: skip
        assert stats.metrics["train/nll"] == pytest.approx(expected, rel=1e-4)
    assert nll(2.0) != pytest.approx(nll(1.0), rel=1e-3)  # the tiny model is near uniform


def test_merging_duplicates_refuses_a_per_sequence_mean():
    with pytest.raises(ValueError, match="merge_duplicates.*token-mean"):
        SFTConfig(merge_duplicates=True, loss_agg_mode="seq-mean-token-mean")
