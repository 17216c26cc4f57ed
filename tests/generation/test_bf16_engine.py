"""The bf16 rollout engine on CPU (`rollout.backend.quantize: bf16`): the whole model in bf16
where the CPU has bf16 instructions, fp32 where it has not, decode-step attention in fp32, and
the rollout correction a recipe then needs. Where this CPU lacks bf16 instructions the tests
force bf16 anyway (`peak_flops.cpu_bf16`): it is slower there, not different."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from pydantic import ValidationError

from sparring import peak_flops
from sparring.generation import attention
from sparring.generation.factory import BackendConfig
from sparring.generation.hf import HFBackend
from sparring.generation.packed_linear import PackedLinear
from sparring.recipe import Recipe


@pytest.fixture
def bf16_pays(monkeypatch):
    """Whether the engine finds bf16 worth it, set by the test (the CPU's own answer aside)."""

    def set_to(value: bool) -> None:
        monkeypatch.setattr(peak_flops, "cpu_bf16", lambda setting: value)

    return set_to


def test_bf16_engine_samples_with_log_probs_near_the_fp32_trainers(
    tiny_model_dir, bf16_pays, log_prob_gap
):
    """Every weight is bf16 and packed; the drawn tokens' log-probs come back as fp32 numbers a
    little apart from the fp32 model's (the gap the rollout correction covers)."""
    bf16_pays(True)
    engine = HFBackend(str(tiny_model_dir), device="cpu", quantize="bf16")
    assert {p.dtype for p in engine.model.parameters()} == {torch.bfloat16}
    if any(isinstance(m, PackedLinear) for m in engine.model.modules()):  # oneDNN present
        assert not any(type(m) is torch.nn.Linear for m in engine.model.modules())
    assert 1e-6 < log_prob_gap(engine).max() < 0.1


def test_without_bf16_instructions_the_engine_stays_fp32(tiny_model_dir, bf16_pays, capsys):
    bf16_pays(False)
    engine = HFBackend(str(tiny_model_dir), device="cpu", quantize="bf16")
    assert {p.dtype for p in engine.model.parameters()} == {torch.float32}
    assert "stays fp32" in capsys.readouterr().err


@torch.inference_mode()
@pytest.mark.parametrize("additive", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_decode_step_equals_torchs_fp32_attention(dtype, additive):
    """One query per row (decode), in bf16 through the two products, in fp32 through torch's
    kernel: torch's fused fp32 attention over the same values, a query head's group sharing
    its key/value head, the padding masked; a longer query (prefill) keeps its dtype."""
    torch.manual_seed(0)
    module = torch.nn.Module()
    q, k, v = torch.randn(2, 6, 1, 16), torch.randn(2, 2, 9, 16), torch.randn(2, 2, 9, 16)
    k[0, :, :3] *= 50  # row 0's left padding: huge keys, which only the mask keeps out
    mask = torch.ones(2, 1, 1, 9, dtype=torch.bool)
    mask[0, ..., :3] = False
    q, k, v = (t.to(dtype) for t in (q, k, v))

    def torchs(attn_mask):  # (B, 1, H, D), as sdpa_gqa returns it
        out = F.scaled_dot_product_attention(
            q.float(), k.float(), v.float(), attn_mask=attn_mask, enable_gqa=True
        )
        return out.transpose(1, 2)

    given = torch.zeros(2, 1, 1, 9).masked_fill(~mask, float("-inf")) if additive else mask
    out, _ = attention.sdpa_gqa(module, q, k, v, given.to(dtype) if additive else given)
    assert out.dtype == dtype and out.shape == (2, 1, 6, 16)
    tol = 0.02 if dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(out.float(), torchs(mask), atol=tol, rtol=tol)
    assert not torch.allclose(torchs(None)[0], torchs(mask)[0], atol=0.1)  # the mask mattered
    longer, _ = attention.sdpa_gqa(module, q.expand(2, 6, 3, 16), k, v, None)
    assert longer.dtype == dtype


@pytest.mark.parametrize("quantize", ["int8", "bf16"])
def test_a_quantized_rollout_turns_the_rollout_correction_on(quantize):
    quantized = {"rollout": {"backend": {"quantize": quantize}}}
    assert Recipe.model_validate(quantized).train.rollout_is == "token"
    assert Recipe.model_validate({}).train.rollout_is is None
    chosen = Recipe.model_validate(quantized | {"train": {"rollout_is": "sequence"}})
    assert chosen.train.rollout_is == "sequence"
    with pytest.raises(ValidationError, match="needs the rollout correction"):
        Recipe.model_validate(quantized | {"train": {"rollout_is": None}})
    bypass = quantized | {"train": {"bypass_mode": True}}
    if quantize == "int8":  # its log-probs are too far from the trainer's to be the old ones
        with pytest.raises(ValidationError, match="bypass_mode: false"):
            Recipe.model_validate(bypass)
    else:  # close enough: PPO's ratio against them is the correction, no TIS on top
        assert Recipe.model_validate(bypass).train.rollout_is is None
    with pytest.raises(ValidationError, match="hf engine's"):
        BackendConfig(name="openai", base_url="http://x:1", quantize=quantize)


def test_bf16_smollm2_answers_as_fp32_does(smollm2_answers, bf16_pays):
    """The real SmolLM2 in bf16 greedily answers what fp32 answers, its log-probs close."""
    bf16_pays(True)
    fp32, bf16, text = smollm2_answers("bf16")
    assert "Paris" in text
    assert bf16.token_ids == fp32.token_ids
    assert bf16.log_probs == pytest.approx(fp32.log_probs, abs=0.1)
