"""The trainer's bf16 autocast on CPU (`train.cpu_bf16`): the probe that decides `auto`, the
decoder in bf16 with the LM head in fp32, and the rollout correction a recipe then needs. bf16
runs on any x86 CPU (slowly without bf16 instructions), so these tests hold on every machine;
only what `auto` picks depends on the CPU."""

from __future__ import annotations

import pandas as pd
import pytest
import torch
from pydantic import ValidationError
from transformers import AutoTokenizer

from sparring import logprobs, peak_flops
from sparring.recipe import Recipe
from sparring.train import batched_log_probs, collate, grpo_update, load_model
from sparring.train_config import GRPOConfig

CPU = torch.device("cpu")


def test_auto_follows_the_measured_speedup(monkeypatch):
    speedup = peak_flops.bf16_speedup()  # measured once per process
    assert 0 < speedup < 100
    assert peak_flops.cpu_bf16("auto") == (speedup >= peak_flops.BF16_PAYS)
    assert peak_flops.cpu_bf16(True) and not peak_flops.cpu_bf16(False)
    monkeypatch.setattr(peak_flops, "bf16_speedup", lambda: 0.3)  # an AVX2 CPU's software bf16
    assert not peak_flops.cpu_bf16("auto")
    monkeypatch.setattr(peak_flops, "bf16_speedup", lambda: 4.0)  # AVX512-BF16
    assert peak_flops.cpu_bf16("auto")


def _rows(tokenizer, n: int = 4) -> pd.DataFrame:
    ids = tokenizer("[propose] A-1 B-2 C-3 and then [accept] it", add_special_tokens=False)
    ids = ids.input_ids
    t = len(ids)
    mask = [0] * 3 + [1] * (t - 3)
    return pd.DataFrame(
        {
            "game": [f"g{i // 2}" for i in range(n)],
            "input_ids": [ids] * n,
            "assistant_mask": [mask] * n,
            "token_rewards": [[0.0] * (t - 1) + [float(i % 2)] for i in range(n)],
        }
    )


def test_the_trainer_autocasts_to_bf16_on_cpu_with_an_fp32_head(tiny_model_dir):
    """`train.cpu_bf16`: the decoder's matmuls run in bf16 (the log-probs move by bf16's
    rounding), the LM head and the log-softmax in fp32 (the same hidden state gives the fp32
    head's logits exactly), and an update still trains."""
    model = load_model(tiny_model_dir, CPU)
    df = _rows(AutoTokenizer.from_pretrained(tiny_model_dir))
    batch = collate(df, pad_id=0)
    fp32_cfg, bf16_cfg = GRPOConfig(group_key="game"), GRPOConfig(group_key="game", cpu_bf16=True)
    rows = range(len(df))
    fp32_lp = batched_log_probs(model, batch, rows, fp32_cfg, CPU)
    bf16_lp = batched_log_probs(model, batch, rows, bf16_cfg, CPU)
    gap = (bf16_lp - fp32_lp)[batch.response_mask.bool()].abs()
    assert 1e-6 < gap.max() < 0.05

    head = model.get_output_embeddings()
    h = torch.randn(5, head.in_features)
    with torch.no_grad():
        want = head(h)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert head(h).dtype == torch.bfloat16  # what autocast alone would give
            got = logprobs._head_logits(head, h)
    torch.testing.assert_close(got, want)

    before = [p.detach().clone() for p in model.parameters()]
    adv = torch.zeros_like(batch.response_mask, dtype=torch.float32)
    adv[1::2], adv[::2] = batch.response_mask[1::2], -batch.response_mask[::2]
    metrics = grpo_update(model, batch, adv * batch.response_mask, bf16_cfg, CPU)
    assert torch.isfinite(torch.tensor(metrics["train/loss"]))
    assert any((p - b).abs().max() > 0 for p, b in zip(model.parameters(), before, strict=True))


@pytest.mark.parametrize(
    "section",
    [
        {"train": {"cpu_bf16": True}},
        {"train": {"cpu_bf16": "auto"}},
    ],
)
def test_a_bf16_trainer_turns_the_rollout_correction_on(section):
    assert Recipe.model_validate(section).train.rollout_is == "token"
    train = section.get("train", {})
    with pytest.raises(ValidationError, match="cpu_bf16.*needs the rollout correction"):
        Recipe.model_validate(section | {"train": train | {"rollout_is": None}})
    bypass = Recipe.model_validate(section | {"train": train | {"bypass_mode": True}}).train
    assert bypass.bypass_mode and bypass.rollout_is is None  # the engine's log-probs are old
