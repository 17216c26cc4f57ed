"""Weights packed once for oneDNN (`sparring.generation.packed_linear`) against `nn.Linear`,
and the packed SmolLM2 engine's greedy tokens against plain transformers' argmaxes."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers import AutoModelForCausalLM

from sparring.generation import packed_linear
from sparring.generation.base import SamplingParams
from sparring.generation.hf import HFBackend

pytestmark = pytest.mark.skipif(not packed_linear.available(), reason="no oneDNN in this torch")


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(1, 576), (24, 576), (3, 7, 576)])
def test_packed_linear_equals_nn_linear(bias, shape):
    torch.manual_seed(0)
    linear = nn.Linear(576, 1536, bias=bias)
    x = torch.randn(*shape)
    with torch.inference_mode():
        want = linear(x)
        got = packed_linear.PackedLinear(linear)(x)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_pack_linears_swaps_every_fp32_linear_and_keeps_the_logits(tiny_model_dir):
    plain = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    packed = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    linears = sum(type(m) is nn.Linear for m in plain.modules())
    assert packed_linear.pack_linears(packed) == linears > 0
    assert not any(type(m) is nn.Linear for m in packed.modules())
    ids = torch.randint(0, plain.config.vocab_size, (2, 20))
    with torch.inference_mode():
        torch.testing.assert_close(
            packed(input_ids=ids).logits, plain(input_ids=ids).logits, atol=1e-4, rtol=1e-4
        )


def test_pack_linears_packs_fp32_and_bf16_and_leaves_other_dtypes_alone():
    """bf16 only where oneDNN packs it (AVX-512 or AVX-NE-CONVERT); on an AVX2 CPU the bf16
    layer stays a plain `nn.Linear` and still computes."""
    model = nn.Sequential(
        nn.Linear(8, 8).to(torch.float16), nn.Linear(8, 8).to(torch.bfloat16), nn.Linear(8, 8)
    )
    x = torch.randn(3, 8)
    want = model[2](model[1](x.bfloat16()).float())
    bf16 = packed_linear.bf16_available()
    assert packed_linear.pack_linears(model) == 1 + bf16
    assert type(model[0]) is nn.Linear
    assert type(model[1]) is (packed_linear.PackedLinear if bf16 else nn.Linear)
    assert type(model[2]) is packed_linear.PackedLinear
    with torch.inference_mode():
        torch.testing.assert_close(model[2](model[1](x.bfloat16()).float()), want)


def test_bf16_packing_is_refused_exactly_where_onednn_refuses_it(monkeypatch):
    """`bf16_available` is oneDNN's own answer: a refusal (as on an AVX2 CPU) turns it off."""
    packed_linear.bf16_available.cache_clear()
    monkeypatch.setattr(packed_linear, "available", lambda: True)

    def refuse(weight):
        raise RuntimeError("mkldnn_reorder_linear_weight: bf16 path needs the cpu support")

    monkeypatch.setattr(torch.ops.mkldnn, "_reorder_linear_weight", refuse)
    try:
        assert not packed_linear.bf16_available()
    finally:
        packed_linear.bf16_available.cache_clear()


def test_packed_smollm2_greedy_tokens_are_plain_transformers_argmaxes(smollm2_dir):
    """The real model: every greedy token the engine writes (packed weights, `sdpa_gqa`,
    batched and left-padded) is the argmax of plain transformers' logits, unpacked and one
    sequence at a time, up to float rounding (a near-tie may go either way on another CPU)."""
    backend = HFBackend(str(smollm2_dir), device="cpu")
    assert not any(type(m) is nn.Linear for m in backend.model.modules())
    tok = backend.tokenizer
    questions = [
        "Name three primary colors.",
        "Reply with one tag: [propose] or [accept].",
        "What is 12 plus 30? Answer with the number only, then explain in one sentence.",
    ]
    prompts = [
        tok.apply_chat_template(
            [{"role": "user", "content": q}], add_generation_prompt=True, return_dict=False
        )
        for q in questions
    ]
    replies = backend.generate(prompts, SamplingParams(temperature=0.0, max_new_tokens=16))

    plain = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()
    for prompt, reply in zip(prompts, replies, strict=True):
        ids = reply.token_ids
        assert len(ids) >= 4  # a real reply, not an immediate stop
        with torch.inference_mode():
            logits = plain(input_ids=torch.tensor([prompt + ids])).logits[0]
        chosen = logits[len(prompt) - 1 : -1]  # (reply, V): the logits each token was drawn at
        picked = chosen.gather(1, torch.tensor(ids)[:, None])[:, 0]
        assert (chosen.max(-1).values - picked).max() < 1e-3
