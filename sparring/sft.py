"""Supervised warm start: next-token loss on each seat's own replies (`assistant_mask`).

    sparring sft --model runs/tiny --samples runs/scripted/samples.parquet --out runs/sft

The default data is scripted-agent self-play (`sparring rollout --seats
matching-scripted,matching-scripted --tokenizer <model>`), which teaches a tiny model the
protocol before RL. It reuses the trainer's data path (`sparring.train`): samples loading,
collation, log-probs, mini/micro-batching with verl's `agg_loss` (`grpo.aggregate`), and the
checkpoint format.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import torch
from transformers import AutoTokenizer

from sparring import grpo
from sparring.device import pick_device
from sparring.train import (
    Batch,
    TrainStats,
    collate,
    load_model,
    load_samples,
    optimize,
    save_checkpoint,
    schedule,
    token_log_probs,
)
from sparring.train_config import SFTConfig


def sft_loss(model, mb: Batch, rows: list[int], actor_cfg) -> tuple[torch.Tensor, dict]:
    """Negative log-likelihood of the masked tokens, aggregated over the whole mini-batch."""
    log_prob, _ = token_log_probs(model, mb)  # (b, T-1)
    nll = grpo.aggregate(-log_prob, mb.response_mask, actor_cfg)
    mean_nll = -(log_prob.detach() * mb.response_mask).sum() / mb.response_mask.sum()
    return nll, {"nll": mean_nll}


def row_weights(df: pd.DataFrame) -> np.ndarray:
    """Each row's weight: the samples' optional `weight` column (a row of weight w trains as w
    copies of it), else 1."""
    if "weight" not in df.columns:
        return np.ones(len(df), np.float32)
    weights = df["weight"].to_numpy(np.float32)
    if not np.isfinite(weights).all() or (weights < 0).any():
        raise ValueError("the samples' weight column holds a negative or non-finite weight")
    return weights


def distinct_rows(df: pd.DataFrame) -> tuple[pd.DataFrame, np.ndarray]:
    """The distinct rows of `df` (same tokens, mask and temperature), first seen first, and
    how many times each occurs (their weights summed, `row_weights`)."""
    keys = [
        (np.asarray(x).tobytes(), np.asarray(m).tobytes(), t)
        for x, m, t in zip(
            df.input_ids,
            df.assistant_mask,
            df["temperature"] if "temperature" in df.columns else [None] * len(df),
            strict=True,
        )
    ]
    first, counts = {}, {}
    for i, (k, w) in enumerate(zip(keys, row_weights(df), strict=True)):
        first.setdefault(k, i)
        counts[k] = counts.get(k, 0.0) + float(w)
    kept = df.iloc[list(first.values())].reset_index(drop=True)
    return kept, np.array([counts[k] for k in first], dtype=np.float32)


def sft(
    model_path: str | Path,
    samples_paths: list[str | Path],
    out_dir: str | Path,
    cfg: SFTConfig | None = None,
    device: str = "auto",
) -> TrainStats:
    """Fine-tune `model_path` on every row of the samples (whatever policy played it, e.g.
    scripted self-play; a row of `weight` w as w copies); saves a HF checkpoint and
    metrics.json to `out_dir`."""
    cfg = cfg or SFTConfig()
    torch.manual_seed(cfg.seed)
    device = pick_device(device)
    df = load_samples(samples_paths, policy=None)
    samples = len(df)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    if not cfg.at_sampling_temperature:  # imitation: plain softmax
        df = df.drop(columns=["temperature", "top_p"], errors="ignore")
    counts = None
    if "weight" in df.columns:
        cfg.check_weighted("the samples weigh their rows")
        counts = row_weights(df)
    if cfg.merge_duplicates:
        df, counts = distinct_rows(df)
    batch = collate(df, tokenizer.pad_token_id, cfg.max_seq_len, counts)
    model = load_model(model_path, device, cfg=cfg)
    actor_cfg = grpo.actor_config(0.2, None, cfg.loss_agg_mode)  # only its loss aggregation
    plan = schedule(len(batch), cfg)
    if cfg.steps is not None:  # as many passes as the steps take, the last cut short
        passes = -(-cfg.steps // len(plan)) * cfg.epochs
        plan = schedule(len(batch), cfg.model_copy(update={"epochs": passes}))[: cfg.steps]
    metrics = optimize(model, batch, plan, cfg, device, sft_loss, "sft", actor_cfg)
    metrics["train/samples"] = float(samples)
    metrics["train/distinct_samples"] = float(len(df))
    return TrainStats(save_checkpoint(model, tokenizer, out_dir, metrics), metrics)
