"""Rows packed behind a shared prompt (sparring.shared_prefix) score and train exactly as
unpacked rows, on real models; the micro-batches and mini-batches that keep prompts whole."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from sparring.logprobs import token_log_probs
from sparring.shared_prefix import pack, prefix_length
from sparring.train import GRPOConfig, prompt_chunks, schedule


def rows_with_prefixes(vocab: int, seed: int = 0):
    """Six right-padded rows in three prompt groups: two rows sharing 12 tokens, three sharing
    9 (one of them only 10 long, so the shared prefix stops at 9), one alone. Scored positions
    fall inside the prefixes too."""
    gen = torch.Generator().manual_seed(seed)
    draw = lambda n: torch.randint(3, vocab, (n,), generator=gen)  # noqa: E731
    a, b = draw(12), draw(9)
    seqs = [
        torch.cat([a, draw(7)]),
        torch.cat([a, draw(3)]),
        torch.cat([b, draw(8)]),
        torch.cat([b, draw(1)]),
        torch.cat([b, draw(11)]),
        draw(14),
    ]
    group = torch.tensor([4, 4, 7, 7, 7, 2])
    t = max(len(s) for s in seqs)
    ids = torch.zeros(len(seqs), t, dtype=torch.long)
    mask = torch.zeros(len(seqs), t, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)], mask[i, : len(s)] = s, 1
    scored = mask[:, 1:].clone().float()  # (B, T-1): every real next token
    scored[:, :5] = 0
    return ids, mask, scored, group


def scores(model, ids, mask, scored, group=None):
    """Log-probs (B, T-1) at T=0.7 and the gradient of their sum."""
    model.zero_grad(set_to_none=True)
    temps = torch.full((len(ids),), 0.7)
    lp, _ = token_log_probs(model, ids, mask, scored, temperature=temps, prefix_group=group)
    (lp * scored).sum().backward()
    grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    return lp.detach(), grads


def test_prefix_length_stops_where_rows_differ_and_leaves_each_row_a_token():
    rows = torch.tensor([[1, 2, 3, 4, 5], [1, 2, 3, 9, 9], [1, 2, 3, 4, 0]])
    assert prefix_length(rows[:2], [5, 5]) == 3
    assert prefix_length(rows[[0, 2]], [5, 4]) == 3  # the 4-token row keeps its last token
    assert prefix_length(rows[:1], [5]) == 4


def test_packing_puts_each_prefix_once_and_restarts_positions_for_each_suffix():
    ids, mask, _, group = rows_with_prefixes(50)
    packing = pack(ids, mask, group)
    lengths = mask.sum(1)
    # groups in order of appearance: 12 + 7 + 3 tokens, 9 + 8 + 1 + 11, 13 + 1
    assert packing.input_ids.shape == (3, 9 + 8 + 1 + 11)
    assert packing.row_group.tolist() == [0, 0, 1, 1, 1, 2]
    assert packing.position_ids[0, :22].tolist() == list(range(19)) + [12, 13, 14]
    for r in range(len(ids)):  # every real token sits where `column` says
        n = int(lengths[r])
        got = packing.input_ids[packing.row_group[r], packing.column[r, :n]]
        assert torch.equal(got, ids[r, :n])
        assert torch.equal(
            packing.position_ids[packing.row_group[r], packing.column[r, :n]], torch.arange(n)
        )
    assert packing.spans == [(12, [7, 3]), (9, [8, 1, 11]), (13, [1])]


def test_packed_rows_score_and_train_as_unpacked_rows(tiny_model_dir):
    """The tiny Qwen2-style model (grouped-query attention): log-probs to 1e-5, every
    parameter's gradient to 1e-4 of its scale, with and without gradient checkpointing."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    ids, mask, scored, group = rows_with_prefixes(model.config.vocab_size)
    ref_lp, ref_grads = scores(model, ids, mask, scored)
    for checkpointing in (False, True):
        if checkpointing:
            from sparring.policy_model import enable_gradient_checkpointing

            enable_gradient_checkpointing(model)
        lp, grads = scores(model, ids, mask, scored, group)
        assert (lp - ref_lp).abs().max() < 1e-5
        assert len(grads) == len(ref_grads)
        for g, r in zip(grads, ref_grads, strict=True):
            assert (g - r).abs().max() <= 1e-4 * r.abs().max() + 1e-7


def test_packed_rows_train_under_cpu_bf16_autocast(tiny_model_dir):
    """Under CPU bf16 autocast (`train.cpu_bf16`) the packed forward and backward run and stay
    within bf16's rounding of the unpacked ones."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    ids, mask, scored, group = rows_with_prefixes(model.config.vocab_size)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref_lp, ref_grads = scores(model, ids, mask, scored)
        lp, grads = scores(model, ids, mask, scored, group)
    on = scored.bool()
    assert (lp - ref_lp)[on].abs().mean() < 0.02 * ref_lp[on].abs().mean()
    for g, r in zip(grads, ref_grads, strict=True):
        assert torch.isfinite(g).all()
        assert (g - r).norm() <= 0.05 * r.norm() + 1e-6


def test_packed_rows_score_as_unpacked_rows_on_smollm2(smollm2_dir):
    """SmolLM2-135M (Llama, 9 query heads over 3 key/value heads): the same log-probs."""
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()
    ids, mask, scored, group = rows_with_prefixes(model.config.vocab_size, seed=1)
    temps = torch.full((len(ids),), 0.7)
    with torch.no_grad():
        ref, _ = token_log_probs(model, ids, mask, scored, temperature=temps)
        got, _ = token_log_probs(model, ids, mask, scored, temperature=temps, prefix_group=group)
    assert (got - ref).abs().max() < 1e-4


def test_prompt_chunks_keep_each_prompts_rows_together():
    group = [0, 0, 0, 1, 1, 2, 0, 3]
    lengths = [10, 30, 20, 5, 50, 40, 25, 1]
    chunks = prompt_chunks(list(range(8)), group, lengths, size=3)
    assert sorted(r for c in chunks for r in c) == list(range(8))
    assert all(len(c) <= 3 for c in chunks)
    for g in set(group):  # a group is split only into chunks of `size` rows
        holding = [c for c in chunks if any(group[r] == g for r in c)]
        assert len(holding) == -(-group.count(g) // 3)
    assert [1, 6, 2] in chunks  # group 0's longest rows first, then its last row elsewhere


def test_prompt_mini_batches_hold_whole_chunks_and_every_row_once_per_epoch():
    prompts = [k // 8 for k in range(48)]  # six groups of 8 rows
    cfg = GRPOConfig(mini_batch_size=16, micro_batch_size=8, epochs=2, mini_batches="prompts")
    plan = schedule(48, cfg, prompts=prompts)
    assert len(plan) == 6 and all(len(m) == 16 for m in plan)
    for epoch in (plan[:3], plan[3:]):
        assert sorted(r for m in epoch for r in m) == list(range(48))
    for mini in plan:
        assert sorted({prompts[r] for r in mini}) == sorted({r // 8 for r in mini})
        assert all(sum(prompts[r] == g for r in mini) == 8 for g in {prompts[r] for r in mini})
    assert [m[0] // 8 for m in plan[:3]] != [0, 2, 4]  # shuffled groups, not in order
    # micro-batches of 4: each mini-batch holds four chunks of 4 rows, each of one group
    halves = schedule(48, cfg.model_copy(update={"micro_batch_size": 4}), prompts=prompts)
    assert len(halves) == 6 and sorted(r for m in halves[:3] for r in m) == list(range(48))
    for mini in halves:
        chunks = [mini[i : i + 4] for i in range(0, 16, 4)]
        assert all(len({prompts[r] for r in c}) == 1 for c in chunks)
    assert any(len({prompts[r] for r in m}) > 2 for m in halves)  # half groups mix further


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"share_prefix": True, "transfer_weight": 0.1, "transfer_pairs": [("a", "b")]},
         "transfer loss pairs"),
        ({"mini_batches": "prompts", "balance_by": "role"}, "choose one"),
    ],
)  # fmt: skip
def test_options_that_reorder_rows_refuse_each_other(overrides, message):
    with pytest.raises(ValueError, match=message):
        GRPOConfig(**overrides)
