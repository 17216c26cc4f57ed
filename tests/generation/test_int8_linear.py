"""The int8 rollout engine (`sparring.generation.int8_linear`): dynamic int8 linear layers with
an fp32 fallback for small inputs, generation with its log-probs, and the rollout correction a
recipe then needs."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError
from torch import nn
from transformers import AutoModelForCausalLM

from sparring.generation.base import SamplingParams
from sparring.generation.factory import BackendConfig
from sparring.generation.hf import HFBackend
from sparring.generation.int8_linear import Int8Linear
from sparring.recipe import Recipe

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
        assert Int8Linear(linear).fp32 is None  # min_rows 1: no fp32 copy kept
        single = torch.randn(1, 576)
        assert not torch.allclose(Int8Linear(linear)(single), linear(single), atol=1e-5)


def test_int8_engine_samples_with_log_probs_near_the_fp32_trainers(tiny_model_dir):
    """Every linear layer of the engine is int8, the LM head too; its log-probs of the tokens
    it drew at T=0.7 are those of its own policy, a little apart from the fp32 model's at 0.7
    (the gap the rollout correction covers; measured max |diff| ~0.01 on this random model)."""
    engine = HFBackend(str(tiny_model_dir), device="cpu", quantize="int8")
    assert not any(type(m) is nn.Linear for m in engine.model.modules())
    assert isinstance(engine.model.lm_head, Int8Linear)
    prompt = engine.tokenizer("Propose a deal: [propose] A-1", add_special_tokens=False).input_ids
    params = SamplingParams(temperature=0.7, max_new_tokens=8, seed=3)
    (out,) = engine.generate([prompt], params)
    assert len(out.log_probs) == len(out.token_ids) > 0

    fp32 = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    ids = torch.tensor([prompt + out.token_ids])
    with torch.inference_mode():
        logits = fp32(input_ids=ids).logits[0, len(prompt) - 1 : -1] / 0.7  # (n, V)
    want = logits.log_softmax(-1).gather(-1, torch.tensor(out.token_ids)[:, None])[:, 0]
    gap = (torch.tensor(out.log_probs) - want).abs().max()
    assert 1e-6 < gap < 0.1


def test_a_quantized_rollout_turns_the_rollout_correction_on():
    quantized = {"rollout": {"backend": {"quantize": "int8"}}}
    assert Recipe.model_validate(quantized).train.rollout_is == "token"
    assert Recipe.model_validate({}).train.rollout_is is None
    chosen = Recipe.model_validate(quantized | {"train": {"rollout_is": "sequence"}})
    assert chosen.train.rollout_is == "sequence"
    for train in [{"rollout_is": None}, {"bypass_mode": True}]:
        with pytest.raises(ValidationError, match="needs the rollout correction"):
            Recipe.model_validate(quantized | {"train": train})
    with pytest.raises(ValidationError, match="hf engine's"):
        BackendConfig(name="openai", base_url="http://x:1", quantize="int8")
