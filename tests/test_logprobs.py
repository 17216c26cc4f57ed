"""Memory-efficient log-probs and entropy against a float64 log-softmax reference.

The reference is the naive computation, log_softmax over the whole (N, V) logits, in float64:
the fp32 naive path itself is off by ~1e-5 at V = 49152 (logits reach ~30).
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from sparring.logprobs import selective_log_softmax, token_log_probs

VOCAB = 49152  # SmolLM2's


def reference(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(log p(label), entropy) from a float64 log-softmax over the full logits (..., V)."""
    logp = torch.log_softmax(logits.double(), dim=-1)  # (..., V)
    return logp.gather(-1, labels[..., None]).squeeze(-1), -(logp.exp() * logp).sum(-1)


def test_chunked_selective_log_softmax_matches_the_reference_at_a_real_vocab():
    gen = torch.Generator().manual_seed(0)
    head = torch.nn.Linear(64, VOCAB, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.randn(VOCAB, 64, generator=gen) * 0.5)  # logits of std ~4
    rows = torch.randn(300, 64, generator=gen, requires_grad=True)  # (N, H)
    labels = torch.randint(0, VOCAB, (300,), generator=gen)  # (N,)
    # 7 chunks of 45 (the last 30): chunk edges must not matter
    lp, ent = selective_log_softmax(rows, head, labels, True, True, chunk_tokens=45)
    ref_lp, ref_ent = reference(head(rows), labels)
    assert lp.dtype == ent.dtype == torch.float32
    torch.testing.assert_close(lp.double(), ref_lp, atol=1e-5, rtol=0)
    torch.testing.assert_close(ent.double(), ref_ent, atol=1e-5, rtol=1e-5)
    # gradients through the checkpointed chunks, to rows and to the head's weight
    w = torch.randn(300, generator=gen)
    (lp * w + 0.1 * ent * w).sum().backward()
    got = rows.grad.clone(), head.weight.grad.clone()
    rows.grad, head.weight.grad = None, None
    ref_lp, ref_ent = reference(head(rows), labels)
    (ref_lp * w + 0.1 * ref_ent * w).sum().float().backward()
    torch.testing.assert_close(got[0], rows.grad, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(got[1], head.weight.grad, atol=1e-5, rtol=1e-4)


def test_entropy_without_entropy_grad_carries_no_gradient():
    head = torch.nn.Linear(8, 100)
    rows = torch.randn(10, 8, requires_grad=True)
    lp, ent = selective_log_softmax(rows, head, torch.zeros(10, dtype=torch.long), True, False, 4)
    assert lp.requires_grad and not ent.requires_grad
    lp, ent = selective_log_softmax(rows, head, torch.zeros(10, dtype=torch.long), False)
    assert ent is None


def test_a_micro_batch_without_response_tokens_backpropagates_zero(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    ids, attn, mask = batch_of_two(model.config.vocab_size)
    lp, ent = token_log_probs(model, ids, attn, torch.zeros_like(mask), True, True)
    assert (lp == 0).all() and (ent == 0).all()
    (lp.sum() + ent.sum()).backward()  # a loss over no tokens is 0, not an autograd error
    assert all(p.grad is None or not p.grad.any() for p in model.parameters())


@pytest.fixture(scope="module")
def smollm2(smollm2_dir):
    return AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()


def batch_of_two(vocab: int):
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(3, vocab, (2, 48), generator=gen)  # (B, T)
    attn = torch.ones_like(ids)
    attn[1, 40:] = 0  # right padding
    mask = torch.zeros(2, 47)  # (B, T-1): two replies, as in a rollout row
    mask[:, 10:20] = 1
    mask[1, 30:36] = 1
    return ids, attn, mask


def test_model_log_probs_match_the_full_logits_reference(smollm2):
    ids, attn, mask = batch_of_two(VOCAB)
    lp, ent = token_log_probs(smollm2, ids, attn, mask, True, True, chunk_elements=7 * VOCAB)
    logits = smollm2(input_ids=ids, attention_mask=attn).logits[:, :-1]  # (B, T-1, V)
    ref_lp, ref_ent = reference(logits, ids[:, 1:])
    on = mask.bool()
    # relative too: a 7-row head matmul rounds differently from the full one (logits ~30)
    torch.testing.assert_close(lp[on].double(), ref_lp[on], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent[on].double(), ref_ent[on], atol=1e-5, rtol=1e-5)
    assert (lp[~on] == 0).all() and (ent[~on] == 0).all()  # only the loss positions
    # the same gradient reaches the weights as through the full-logits reference
    (lp.sum() + ent.sum()).backward()
    weight = smollm2.model.layers[5].mlp.up_proj.weight
    got, weight.grad = weight.grad.clone(), None
    ref_lp, ref_ent = reference(
        smollm2(input_ids=ids, attention_mask=attn).logits[:, :-1], ids[:, 1:]
    )
    (ref_lp[on].sum() + ref_ent[on].sum()).float().backward()
    torch.testing.assert_close(got, weight.grad, atol=1e-4, rtol=1e-3)
    smollm2.zero_grad(set_to_none=True)


def test_models_with_their_own_logits_take_the_fallback(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    ids, attn, mask = batch_of_two(model.config.vocab_size)
    split, _ = token_log_probs(model, ids, attn, mask, True)
    assert model._sparring_plain_head is True  # checked once, remembered
    model._sparring_plain_head = False  # as for a soft-capping model: full logits, gathered
    fallback, _ = token_log_probs(model, ids, attn, mask, True)
    torch.testing.assert_close(split, fallback, atol=1e-6, rtol=0)


def test_log_probs_describe_the_tempered_distribution():
    """One position, vocab 3, logits (0, ln 2, ln 4), label 2. At T=1: p = (1, 2, 4) / 7, so
    log p(2) = ln 4 - ln 7. At T=0.5 the logits double to (0, 2 ln 2, 4 ln 4) = ln(1, 4, 16):
    p = (1, 4, 16) / 21, so log p(2) = ln 16 - ln 21. Entropy at T=0.5: -sum p ln p."""
    logits = torch.tensor([[0.0, torch.log(torch.tensor(2.0)), torch.log(torch.tensor(4.0))]])
    label = torch.tensor([2])
    at_1, _ = selective_log_softmax(logits, torch.nn.Identity(), label)
    assert at_1.item() == pytest.approx(torch.log(torch.tensor(4 / 7)).item(), abs=1e-6)
    half, entropy = selective_log_softmax(
        logits, torch.nn.Identity(), label, with_entropy=True, temperature=torch.tensor([0.5])
    )
    assert half.item() == pytest.approx(torch.log(torch.tensor(16 / 21)).item(), abs=1e-6)
    p = torch.tensor([1.0, 4.0, 16.0]) / 21
    assert entropy.item() == pytest.approx(-(p * p.log()).sum().item(), abs=1e-6)


def test_each_row_is_scored_at_its_own_temperature(tiny_model_dir):
    """A batch whose rows were sampled at 0.7 and 1.0: each row's log-probs equal the full
    log-softmax of the model's logits divided by that row's temperature."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    ids = torch.randint(
        0, model.config.vocab_size, (2, 10), generator=torch.Generator().manual_seed(0)
    )
    attn, mask = torch.ones_like(ids), torch.ones(2, 9)
    temps = torch.tensor([0.7, 1.0])
    with torch.no_grad():
        lp, _ = token_log_probs(model, ids, attn, mask, temperature=temps)
        logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1].float()  # (2, 9, V)
        want = torch.log_softmax(logits / temps[:, None, None], -1).gather(-1, ids[:, 1:, None])
    torch.testing.assert_close(lp, want.squeeze(-1), atol=1e-4, rtol=1e-4)
    with torch.no_grad():
        at_1, _ = token_log_probs(model, ids, attn, mask)
    assert not torch.allclose(lp[0], at_1[0], atol=1e-3)  # the T=0.7 row differs from T=1
    torch.testing.assert_close(lp[1], at_1[1])
