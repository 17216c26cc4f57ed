"""`sdpa_gqa` (grouped-query attention without key/value copies) against transformers' eager
attention, which repeats the key/value heads: same logits with padding masks and a KV cache,
and the same greedy tokens through the batched engine."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

from sparring.generation import attention
from sparring.generation.base import SamplingParams
from sparring.generation.hf import HFBackend
from sparring.tiny_model import TinyModelConfig, init_tiny


@pytest.fixture(scope="module")
def gqa_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny model with 4 query heads sharing 2 key/value heads; queries and keys scaled up so
    that a wrong mask, position or head pairing changes the greedy tokens."""
    out = init_tiny(tmp_path_factory.mktemp("gqa"), TinyModelConfig(num_heads=4, num_kv_heads=2))
    model = AutoModelForCausalLM.from_pretrained(out)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(8.0)
            layer.self_attn.k_proj.weight.mul_(8.0)
    model.save_pretrained(out)
    return out


def _load(path: Path, implementation: str) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(path, attn_implementation=implementation).eval()


@torch.inference_mode()
def test_logits_equal_eager_attention_with_padding_and_a_cache(gqa_model):
    ours, eager = _load(gqa_model, attention.register()), _load(gqa_model, "eager")
    assert ours.config.num_key_value_heads < ours.config.num_attention_heads
    ids = torch.randint(10, 400, (3, 12))
    mask = torch.ones(3, 12, dtype=torch.long)
    mask[1, :5] = 0  # left padding of different lengths
    mask[2, :9] = 0
    position = (mask.cumsum(-1) - 1).clamp_min(0)
    caches = {}
    for name, model in (("ours", ours), ("eager", eager)):
        cache = DynamicCache()
        prefill = model(
            input_ids=ids, attention_mask=mask, position_ids=position, past_key_values=cache
        ).logits
        step = model(  # one decode step on top of the cache
            input_ids=ids[:, -1:],
            attention_mask=torch.cat([mask, torch.ones(3, 1, dtype=torch.long)], 1),
            position_ids=position[:, -1:] + 1,
            past_key_values=cache,
        ).logits
        caches[name] = (prefill, step)
    for got, want in zip(caches["ours"], caches["eager"], strict=True):
        real = mask.bool() if got.shape[1] == 12 else torch.ones(3, 1, dtype=torch.bool)
        torch.testing.assert_close(got[real], want[real], atol=1e-5, rtol=1e-5)


def test_the_cpu_engine_uses_it_and_keeps_eagers_greedy_tokens(gqa_model):
    backend = HFBackend(str(gqa_model), device="cpu", prefill_tokens=40)
    assert backend.model.config._attn_implementation == attention.NAME
    tok = AutoTokenizer.from_pretrained(gqa_model)
    eager = _load(gqa_model, "eager")
    prompts = [
        tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)[
            "input_ids"
        ]
        for text in ("Orders?", "Spring 1901. A PAR, A MAR, F BRE. " * 3, "Your move.")
    ]
    greedy = SamplingParams(temperature=0.0, max_new_tokens=8)
    got = [c.token_ids for c in backend.generate(prompts, greedy)]
    assert all(got)
    for prompt, tokens in zip(prompts, got, strict=True):
        ids = list(prompt)
        with torch.inference_mode():
            for _ in range(len(tokens)):  # uncached, unpadded, one row at a time
                ids.append(int(eager(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
        assert ids[len(prompt) :] == tokens
