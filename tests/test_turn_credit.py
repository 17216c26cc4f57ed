"""Turn-level credit: the tokens of a reply the game rejected get their own advantage
(`rejected_credit`), on hand-made samples whose arithmetic is in the comments."""

from __future__ import annotations

import pytest
import torch
from sample_frames import make_samples, mask_spans
from transformers import AutoTokenizer

from sparring.samples import TokenTrace, rejected_mask
from sparring.train import NoSignalError, advantages_for, collate
from sparring.train_config import GRPOConfig


def test_rejected_mask_marks_the_replies_whose_transcript_entry_failed():
    replies = [(1, 3), (5, 5), (7, 10)]  # seat 0's replies; the second generated no token
    transcript = [
        {"seat": 0, "ok": False},  # reply 1: rejected, then retried
        {"seat": 1, "ok": True},
        {"seat": 0, "ok": False},  # reply 2: empty, rejected: marks nothing
        {"seat": 0, "ok": False},  # reply 3
    ]
    assert rejected_mask(10, replies, transcript, 0) == [0, 1, 1, 0, 0, 0, 0, 1, 1, 1]
    with pytest.raises(ValueError, match="3 replies but 1 transcript entries"):
        rejected_mask(10, replies, transcript[1:3], 0)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def rows(tokenizer, rewards):
    """Samples of two replies each, the first of which the game rejected."""
    df = make_samples(tokenizer, rewards)
    first = [mask_spans(m)[0] for m in df.assistant_mask]
    df["rejected_mask"] = [
        [int(a <= t < b) for t in range(len(m))]
        for m, (a, b) in zip(df.assistant_mask, first, strict=True)
    ]
    return df, collate(df, tokenizer.pad_token_id, None)


def reply_advantages(df, batch, advantages) -> list[tuple[float, float]]:
    """(first reply's, second reply's) advantage per row: each is constant over its tokens."""
    out = []
    for i, mask in enumerate(df.assistant_mask):
        (a1, b1), (a2, b2) = mask_spans(mask)
        first, second = advantages[i, a1 - 1 : b1 - 1], advantages[i, a2 - 1 : b2 - 1]
        assert torch.all(first == first[0]) and torch.all(second == second[0])
        out.append((round(first[0].item(), 3), round(second[0].item(), 3)))
    return out


def test_each_credit_rule_by_hand(tokenizer):
    # one batch group, rewards 1, 0, 1, 0: mean 0.5, unbiased std 0.5774, so +-0.866
    df, batch = rows(tokenizer, [1.0, 0.0, 1.0, 0.0])

    def credit(rule):
        cfg = GRPOConfig(group_key="batch", rejected_credit=rule, rejected_penalty=-0.5)
        advantages, metrics = advantages_for(df, batch, cfg)
        return reply_advantages(df, batch, advantages), metrics

    won, lost = (0.866, 0.866), (-0.866, -0.866)
    assert credit("episode")[0] == [won, lost, won, lost]  # every token the episode's
    # exclude: a rejected reply never shares a win (0), but keeps a loss
    assert credit("exclude")[0] == [(0.0, 0.866), lost, (0.0, 0.866), lost]
    # penalty: the rejected reply gets -0.5 whatever the episode
    penalised, metrics = credit("penalty")
    assert penalised == [(-0.5, 0.866), (-0.5, -0.866)] * 2
    share = sum(sum(m) for m in df.rejected_mask) / float(batch.response_mask.sum())
    assert metrics["train/rejected_token_frac"] == pytest.approx(share)


def test_a_penalty_teaches_the_protocol_when_every_reward_ties(tokenizer):
    df, batch = rows(tokenizer, [0.0, 0.0, 0.0, 0.0])  # no group signal at all
    with pytest.raises(NoSignalError):
        advantages_for(df, batch, GRPOConfig(group_key="batch"))
    cfg = GRPOConfig(group_key="batch", rejected_credit="penalty")
    advantages, _ = advantages_for(df, batch, cfg)
    assert reply_advantages(df, batch, advantages) == [(-1.0, 0.0)] * 4


def test_a_reply_that_generated_no_token_keeps_the_masks_aligned(tokenizer):
    """A reply that generated no token (a server's empty reply) leaves no span in the assistant
    mask but has its transcript entry: the trace's reply spans keep the two aligned."""
    trace = TokenTrace(tokenizer)
    messages = [{"role": "system", "content": "seat 0"}, {"role": "user", "content": "go"}]
    for text, ids in (("", []), ("[accept]", None)):
        trace.prompt(messages)
        messages = [*messages, {"role": "assistant", "content": text}]
        trace.reply(messages, ids)
        messages = [*messages, {"role": "user", "content": "again"}]
    empty, second = trace.replies
    assert empty[0] == empty[1] and second[1] > second[0]
    transcript = [{"seat": 0, "ok": False}, {"seat": 0, "ok": False}]
    mask = rejected_mask(len(trace.input_ids), trace.replies, transcript, 0)
    assert [i for i, m in enumerate(mask) if m] == list(range(*second))
