"""The trainer's memory options on the tiny model: gradient checkpointing, LoRA, bf16 weights."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch
from safetensors import safe_open
from sample_frames import make_samples
from transformers import AutoModelForCausalLM, AutoTokenizer

from sparring.policy_model import load_policy
from sparring.train import collate, token_log_probs, train
from sparring.train_config import GRPOConfig

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def samples(tiny_model_dir, tmp_path_factory):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    path = tmp_path_factory.mktemp("samples") / "samples.parquet"
    make_samples(tok, [1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.2, 0.8]).to_parquet(path)
    return path


def grads(model, batch) -> dict[str, torch.Tensor]:
    log_prob, entropy = token_log_probs(model, batch, True, entropy_grad=True)
    (log_prob.sum() + entropy.sum()).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("lora_rank", [0, 4], ids=["full", "lora"])
def test_gradient_checkpointing_recomputes_layers_and_keeps_the_gradients(
    tiny_model_dir, samples, lora_rank
):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    batch = collate(pd.read_parquet(samples), tok.pad_token_id)
    plain = load_policy(tiny_model_dir, CPU, GRPOConfig(lora_rank=lora_rank))
    cfg = GRPOConfig(gradient_checkpointing=True, lora_rank=lora_rank)
    ckpt = load_policy(tiny_model_dir, CPU, cfg)
    ckpt.load_state_dict(plain.state_dict())  # the same (random) LoRA init in both
    calls = []
    layers = (ckpt.get_base_model() if lora_rank else ckpt).model.layers
    layers[0].mlp.register_forward_hook(lambda *_: calls.append(1))
    expected, got = grads(plain, batch), grads(ckpt, batch)
    # one forward for the split-head check, one for the loss, one more recomputed in backward
    assert len(calls) == 3
    assert expected.keys() == got.keys()
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], atol=1e-6, rtol=1e-5)
    # only the checkpointed layers are in training mode: dropout stays off everywhere else
    assert not ckpt.training and not layers[0].self_attn.training and layers[0].training


def test_lora_trains_adapters_and_saves_a_merged_plain_checkpoint(
    tiny_model_dir, samples, tmp_path
):
    cfg = GRPOConfig(lora_rank=4, lr=1e-2, mini_batch_size=8, micro_batch_size=4)
    out = train(tiny_model_dir, [samples], tmp_path / "lora", cfg, device="cpu").out_dir
    assert not list(out.glob("adapter_*"))  # the rollout loads it like any checkpoint
    before = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    after = AutoModelForCausalLM.from_pretrained(out).state_dict()
    assert before.keys() == after.keys()
    q = "model.layers.0.self_attn.q_proj.weight"
    delta = after[q] - before[q]
    assert delta.abs().max() > 0 and torch.linalg.matrix_rank(delta) <= 4  # a rank-4 update
    assert torch.equal(before["model.embed_tokens.weight"], after["model.embed_tokens.weight"])


def test_bf16_weights_train_and_save_in_bf16(tiny_model_dir, samples, tmp_path):
    cfg = GRPOConfig(param_dtype="bfloat16", lr=1e-2, mini_batch_size=8)
    stats = train(tiny_model_dir, [samples], tmp_path / "bf16", cfg, device="cpu")
    assert torch.isfinite(torch.tensor(stats.metrics["train/loss"]))
    with safe_open(stats.out_dir / "model.safetensors", "pt") as f:
        dtypes = {f.get_slice(k).get_dtype() for k in f.keys()}
    assert dtypes == {"BF16"}
    assert json.loads((stats.out_dir / "config.json").read_text())["dtype"] == "bfloat16"
