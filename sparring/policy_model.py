"""Loading the trained policy for GRPO/SFT and saving it for the rollout.

Three memory options, read from the trainer's config (missing fields mean off):
  - `param_dtype`: the weights' dtype, in which checkpoints are also saved. "bfloat16" halves
    weights, gradients and AdamW state, but plain AdamW on bf16 weights rounds away updates
    smaller than half a weight's bf16 step (2^-9 of it: lr 1e-5 on a weight of 0.05 is lost),
    and so does merging a small LoRA delta into bf16 weights each iteration. So it is opt-in
    (with a larger lr, or for memory-bound runs); the default "float32" keeps fp32 master
    weights, and CUDA compute is still bf16 under autocast (`bf16`).
  - `gradient_checkpointing`: recompute each decoder layer's activations in backward. HF only
    checkpoints layers in training mode, so those layers (and nothing else) are put in training
    mode; dropout elsewhere stays off, and attention dropout is read from the attention module.
  - `lora_rank` > 0: train LoRA adapters (peft) on every linear layer but the LM head; the saved
    checkpoint has them merged, so the rollout loads a plain HF checkpoint and needs no adapter
    support. Adapter weights stay float32 when the base is bfloat16 (peft's default).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM

from sparring import heap


def param_dtype(cfg: Any) -> torch.dtype:
    """The weights' dtype for `cfg.param_dtype` (float32 without one)."""
    choice = getattr(cfg, "param_dtype", "float32")
    if choice not in ("float32", "bfloat16"):
        raise ValueError(f"unknown param_dtype {choice!r}; choose float32 or bfloat16")
    return getattr(torch, choice)


def load_policy(path: str | Path, device: torch.device, cfg: Any = None, trainable: bool = True):
    """A HF causal LM on `device` in eval mode (dropout off, so training log-probs match the
    sampling policy's), with `cfg`'s dtype, gradient checkpointing and LoRA applied."""
    dtype = param_dtype(cfg)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
    if device.type == "cpu":
        heap.bound_for(sum(p.numel() for p in model.parameters()))  # before the activations
    model.requires_grad_(trainable)
    if not trainable:
        return model
    if getattr(cfg, "lora_rank", 0):
        model = add_lora(model, cfg)
    if getattr(cfg, "gradient_checkpointing", False):  # after LoRA: its eval() clears the flags
        enable_gradient_checkpointing(model)
    return model


def enable_gradient_checkpointing(model) -> None:
    """HF's non-reentrant checkpointing of every decoder layer, with dropout still off."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # peft
    base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
    if not layers:
        raise ValueError(f"{type(model).__name__} has no checkpointable layers")
    for layer in layers:
        layer.training = True  # only the flag HF checks; the layer's children stay in eval


def add_lora(model, cfg: Any):
    """Wrap `model` with LoRA adapters of rank `cfg.lora_rank` (peft); only they train."""
    from peft import LoraConfig, get_peft_model

    lora = LoraConfig(
        r=cfg.lora_rank,
        lora_alpha=getattr(cfg, "lora_alpha", None) or 2 * cfg.lora_rank,
        lora_dropout=0.0,
        target_modules=getattr(cfg, "lora_target_modules", None) or "all-linear",
        task_type="CAUSAL_LM",
    )
    model = get_peft_model(model, lora)
    model.eval()  # get_peft_model keeps the mode, but be explicit: no dropout anywhere
    return model


def trainable_parameters(model) -> list[torch.nn.Parameter]:
    """The parameters the optimizer updates (all of them, or only LoRA's)."""
    return [p for p in model.parameters() if p.requires_grad]


def save_policy(model, tokenizer, out_dir: str | Path, metrics: dict[str, float]) -> Path:
    """A HF checkpoint (safetensors, config, tokenizer) in the training dtype, LoRA merged,
    plus metrics.json."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if hasattr(model, "merge_and_unload"):  # peft: fold the adapters into the weights
        model = model.merge_and_unload()
    if getattr(model, "is_gradient_checkpointing", False):
        model.gradient_checkpointing_disable()  # not a property of the saved checkpoint
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2, sort_keys=True))
    return out
