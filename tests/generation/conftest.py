"""Shared by the quantized engines' tests."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from transformers import AutoModelForCausalLM

from sparring.generation.base import Completion, SamplingParams
from sparring.generation.hf import HFBackend


@pytest.fixture
def log_prob_gap(tiny_model_dir) -> Callable[[HFBackend], torch.Tensor]:
    """|the engine's log-prob - the fp32 model's| of each token an engine on the tiny model
    draws at T=0.7 after a fixed prompt (n,)."""

    def gap(engine: HFBackend) -> torch.Tensor:
        text = "Propose a deal: [propose] A-1"
        prompt = engine.tokenizer(text, add_special_tokens=False).input_ids
        params = SamplingParams(temperature=0.7, max_new_tokens=8, seed=3)
        (out,) = engine.generate([prompt], params)
        assert len(out.log_probs) == len(out.token_ids) > 0
        fp32 = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
        with torch.inference_mode():
            logits = fp32(input_ids=torch.tensor([prompt + out.token_ids])).logits
        logits = logits[0, len(prompt) - 1 : -1] / 0.7  # (n, V)
        want = logits.log_softmax(-1).gather(-1, torch.tensor(out.token_ids)[:, None])[:, 0]
        return (torch.tensor(out.log_probs) - want).abs()

    return gap


@pytest.fixture
def smollm2_answers(smollm2_dir) -> Callable[[str], tuple[Completion, Completion, str]]:
    """SmolLM2's greedy answer to one question on the fp32 engine and on a `quantize` one, and
    the fp32 answer's text."""
    from sparring.models import resolve_model

    def answers(quantize: str) -> tuple[Completion, Completion, str]:
        model = resolve_model("smollm2-135m-instruct", smollm2_dir.parents[1])
        engines = [HFBackend(model, device="cpu", quantize=q) for q in ("none", quantize)]
        chat = [{"role": "user", "content": "What is the capital of France? One sentence."}]
        prompt = engines[0].tokenizer.apply_chat_template(chat, add_generation_prompt=True)
        prompt = prompt if isinstance(prompt, list) else prompt["input_ids"]
        params = SamplingParams(temperature=0.0, max_new_tokens=10)
        fp32, other = (engine.generate([prompt], params)[0] for engine in engines)
        return fp32, other, engines[0].tokenizer.decode(fp32.token_ids)

    return answers
