"""A stop token other than EOS is part of the trained response, with its rollout log-prob.

The tiny model's tokenizer ends a turn at EOS (<|im_end|>) and at its other special token,
<|endoftext|>. A model that answers with <|endoftext|> at once must be able to learn not to:
the engine keeps the token in the reply, the trace puts it at mask 1 with the engine's log-prob
(the template's <|im_end|> follows as context), and a GRPO update on a negative advantage
lowers its probability.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from sparring.generation.base import SamplingParams
from sparring.generation.hf import HFBackend
from sparring.generation.stops import trim_reply
from sparring.samples import TokenTrace, last_reply_index
from sparring.train import GRPOConfig, collate, load_model, token_log_probs, train

ENDOFTEXT = 0  # the tiny tokenizer's <|endoftext|>: a special token, not EOS
MESSAGES = [
    {"role": "system", "content": "You are seat 0."},
    {"role": "user", "content": "Your move."},
]
CPU = torch.device("cpu")


def prompt_ids(tokenizer) -> list[int]:
    return tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True)["input_ids"]


def stop_prob(model_dir: Path) -> float:
    """p(<|endoftext|> | MESSAGES' generation prompt) under the checkpoint in `model_dir`."""
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    ids = torch.tensor([prompt_ids(AutoTokenizer.from_pretrained(model_dir))])
    with torch.no_grad():
        return float(torch.softmax(model(input_ids=ids).logits[0, -1], -1)[ENDOFTEXT])


@pytest.fixture(scope="module")
def stopper(tiny_model_dir, tmp_path_factory) -> Path:
    """The tiny model with <|endoftext|>'s (tied) embedding set so that after MESSAGES'
    generation prompt its logit equals the logsumexp of all the others: p = 1/2 of stopping at
    once. Its input embedding changes too, which only matters where it is an input."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    assert model.config.tie_word_embeddings
    with torch.no_grad():
        ids = torch.tensor([prompt_ids(tokenizer)])
        h = model.model(input_ids=ids).last_hidden_state[0, -1]  # (H,) after the final norm
        others = torch.logsumexp(model.lm_head(h)[1:], 0)  # logit of 0 := this gives p = 1/2
        model.model.embed_tokens.weight[ENDOFTEXT] = others * h / h.dot(h)
    out = tmp_path_factory.mktemp("stopper")
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    assert stop_prob(out) == pytest.approx(0.5, abs=1e-4)
    return out


def test_trim_reply_keeps_any_stop_token_with_its_log_prob(tiny_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    eos = tokenizer.eos_token_id
    words = tokenizer.encode("[accept]", add_special_tokens=False)
    got = trim_reply([*words, ENDOFTEXT, 7, 8], tokenizer, [ENDOFTEXT, eos], [-0.5] * 9)
    assert got.token_ids == [*words, ENDOFTEXT] and got.finish_reason == "stop"
    assert got.log_probs == [-0.5] * (len(words) + 1) and got.text == "[accept]"
    alone = trim_reply([ENDOFTEXT, 5], tokenizer, [ENDOFTEXT, eos], [-0.7, -1.0])
    assert alone.token_ids == [ENDOFTEXT] and alone.log_probs == [-0.7] and alone.text == ""


def test_an_immediate_stop_is_trained_and_discouraged(stopper, tmp_path):
    engine = HFBackend(str(stopper), device="cpu")
    tokenizer = engine.tokenizer
    assert ENDOFTEXT in engine.stop_ids and tokenizer.eos_token_id != ENDOFTEXT
    traces = [TokenTrace(tokenizer) for _ in range(16)]
    prompts = [trace.prompt(MESSAGES) for trace in traces]
    outs = engine.generate(prompts, SamplingParams(temperature=1.0, max_new_tokens=3, seed=0))
    stopped = [out.token_ids == [ENDOFTEXT] for out in outs]
    assert 3 <= sum(stopped) <= 13  # p = 1/2 each
    for trace, out in zip(traces, outs, strict=True):
        reply = [*MESSAGES, {"role": "assistant", "content": out.text}]
        trace.reply(reply, out.token_ids, out.log_probs)
    # The stop is the reply (mask 1, the engine's log-prob); the template's EOS follows (mask 0).
    n = len(prompts[0])
    eos_tail = tokenizer.encode(tokenizer.eos_token, add_special_tokens=False)
    for trace in (t for t, s in zip(traces, stopped, strict=True) if s):
        assert trace.input_ids[n:][: 1 + len(eos_tail)] == [ENDOFTEXT, *eos_tail]
        assert trace.assistant_mask[n - 1 : n + 2] == [0, 1, 0]
        assert trace.rollout_log_probs[n] == pytest.approx(math.log(0.5), abs=1e-4)
    # samples: an immediate stop loses (reward 0), a reply that goes on wins (reward 1)
    rows = []
    for trace, s in zip(traces, stopped, strict=True):
        end = last_reply_index(trace.assistant_mask)
        reward = 0.0 if s else 1.0
        rows.append(
            {
                "input_ids": trace.input_ids[: end + 1],
                "assistant_mask": trace.assistant_mask[: end + 1],
                "token_rewards": [0.0] * end + [reward],
                "rollout_log_probs": trace.rollout_log_probs[: end + 1],
                "temperature": 1.0,
                "top_p": 1.0,
                "policy": "policy",
            }
        )
    df = pd.DataFrame(rows)
    # the trainer scores the stop token where the engine did, with the same log-prob
    batch = collate(df, tokenizer.pad_token_id)
    with torch.no_grad():
        log_prob, _ = token_log_probs(load_model(stopper, CPU, trainable=False), batch)  # (B, T-1)
    at_stop = torch.tensor(stopped)
    assert (batch.input_ids[at_stop, n] == ENDOFTEXT).all()
    assert (batch.response_mask[at_stop, n - 1] == 1).all()  # position n-1 scores token n
    assert torch.allclose(
        log_prob[at_stop, n - 1], batch.rollout_log_prob[at_stop, n - 1], atol=1e-5
    )
    # one GRPO step: the stop's negative advantage lowers p(stop at once) from 1/2
    df.to_parquet(tmp_path / "samples.parquet")
    cfg = GRPOConfig(group_key="batch", lr=1e-3, mini_batch_size=16, micro_batch_size=16)
    stats = train(stopper, [tmp_path / "samples.parquet"], tmp_path / "m1", cfg, device="cpu")
    assert stats.metrics["train/mismatch_kl"] < 1e-9  # the stop tokens' log-probs agree too
    assert stop_prob(stats.out_dir) < 0.4
