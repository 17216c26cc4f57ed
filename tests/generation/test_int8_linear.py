"""The int8 rollout engine (`sparring.generation.int8_linear`): dynamic int8 linear layers with
an fp32 fallback for small inputs, and generation with its log-probs (the rollout correction a
recipe then needs: test_bf16_engine.py)."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError
from torch import nn

from sparring.generation.factory import BackendConfig
from sparring.generation.hf import HFBackend
from sparring.generation.int8_linear import Int8Linear, full_precision

pytestmark = pytest.mark.skipif(
    "fbgemm" not in torch.backends.quantized.supported_engines, reason="no fbgemm (x86 only)"
)


def test_int8_linear_is_close_to_fp32_and_falls_back_below_min_rows():
    torch.manual_seed(0)
    linear = nn.Linear(576, 1536)
    layer = Int8Linear(linear, min_rows=4)
    with torch.inference_mode():
        for shape in [(3, 576), (1, 3, 576)]:  # 3 rows, however batched: the fp32 layer
            x = torch.randn(*shape)
            torch.testing.assert_close(layer(x), linear(x), atol=1e-5, rtol=1e-5)
        x = torch.randn(2, 2, 576)  # 4 rows: int8, off by its rounding (measured 2% at most)
        gap = (layer(x) - linear(x)).abs().max() / linear(x).abs().max()
        assert 1e-4 < gap < 0.05
        single = torch.randn(1, 576)
        assert not torch.allclose(Int8Linear(linear)(single), linear(single), atol=1e-5)
        with full_precision():  # the engine's prefill: fp32 whatever the rows
            torch.testing.assert_close(layer(x), linear(x), atol=1e-5, rtol=1e-5)
        assert not torch.allclose(layer(x), linear(x), atol=1e-5)  # int8 again after it


def test_int8_engine_samples_with_log_probs_near_the_fp32_trainers(tiny_model_dir, log_prob_gap):
    """Every linear layer of the engine is int8, the LM head too, but the prompt is prefilled
    in fp32: the first drawn token's log-prob at T=0.7 is the fp32 model's, the decoded ones
    are a little apart from it (the gap the rollout correction covers; measured max |diff|
    ~0.01 on this random model)."""
    engine = HFBackend(str(tiny_model_dir), device="cpu", quantize="int8")
    assert not any(type(m) is nn.Linear for m in engine.model.modules())
    assert isinstance(engine.model.lm_head, Int8Linear)
    gap = log_prob_gap(engine)
    assert gap[0] < 1e-5  # from the fp32 prefill
    assert 1e-6 < gap[1:].max() < 0.1  # from int8 decode steps


def test_named_layers_stay_fp32_and_packed(tiny_model_dir):
    keep = ("down_proj", "lm_head")
    engine = HFBackend(str(tiny_model_dir), device="cpu", quantize="int8", int8_fp32_layers=keep)
    kinds = {
        name.rsplit(".", 1)[-1]: type(module).__name__
        for name, module in engine.model.named_modules()
        if name.endswith(("down_proj", "up_proj", "lm_head"))
    }
    assert kinds == {
        "down_proj": "PackedLinear",
        "up_proj": "Int8Linear",
        "lm_head": "PackedLinear",
    }
    with pytest.raises(ValueError, match=r"no layer named \['down_prj'\]"):
        HFBackend(str(tiny_model_dir), device="cpu", quantize="int8", int8_fp32_layers=["down_prj"])
    with pytest.raises(ValidationError, match="for quantize: int8"):
        BackendConfig(int8_fp32_layers=["down_proj"])


def test_int8_smollm2_prefills_in_fp32_and_answers_as_fp32_does(smollm2_answers):
    """On the real SmolLM2 an int8 prefill came apart (its first token's activations set every
    row's int8 scale; per-token KL 2.16 to fp32): the engine prefills in fp32, so its first
    token is the fp32 engine's exactly, and greedy int8 decoding still answers the same."""
    fp32, int8, text = smollm2_answers("int8")
    assert fp32.log_probs[0] == pytest.approx(int8.log_probs[0], abs=1e-4)
    assert "Paris" in text
    assert int8.token_ids == fp32.token_ids
