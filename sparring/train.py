"""GRPO training on rollout samples, with verl's advantage and loss functions.

    sparring train --model runs/iter-1/model --samples runs/iter-1/rollout/samples.parquet \\
        --out runs/iter-2/model --group-key init

Steps (numbered as in the code):
  1. load samples, build right-padded token tensors; the loss covers only `assistant_mask` tokens
  2. old log-probs with the current weights (no grad, micro-batches); in `bypass_mode` the
     rollout engine's log-probs instead, with no pass
  3. reference log-probs when KL is on (the start checkpoint unless another is given)
  4. advantages: verl's `compute_grpo_outcome_advantage`, `index` = the chosen group key; with
     `dynamic_sampling`, the groups whose advantages are all 0 leave the batch (DAPO)
  5. `epochs` PPO epochs of AdamW steps over shuffled mini-batches (with `balance_by`, equal
     rows of each of that column's values in every mini-batch), with gradient
     accumulation over micro-batches and grad-norm clipping; loss = verl's clipped policy loss
     (times truncated importance weights with `rollout_is`; + kl_coef * KL,
     - entropy_coef * entropy; every token's terms times its decision state's weight with
     `state_balance` (`grpo.state_weights`); + transfer_weight * the transfer loss: the
     distance between paired roles' mean prompt hidden states, from the log-probs' own
     forward, per micro-batch: `transfer_term`)
  6. the rollout-trainer mismatch (`train/mismatch_kl`, `train/mismatch_frac_out`:
     sparring.rollout_correction), then a HF checkpoint (safetensors + tokenizer), metrics.json

Outside `bypass_mode`, old log-probs of the first mini-batch are taken from its own first
forward pass: it runs on the start weights, so they are exactly what a separate pass would give
(dropout stays off), and the on-policy case (one mini-batch, one epoch) needs no extra forward.
The data path (`Batch`, `collate`, `token_log_probs`, `optimize`, `save_checkpoint`) is shared
with `sparring.sft`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm
from transformers import AutoTokenizer

from sparring import (
    grpo,
    heap,
    logprobs,
    peak_flops,
    policy_model,
    rollout_correction,
    shared_prefix,
)
from sparring.device import pick_device
from sparring.rae import RoleBaseline
from sparring.samples import GENERIC_GROUP_KEYS, read_samples
from sparring.train_config import GRPOConfig, OptimConfig


@dataclass
class TrainStats:
    """Outcome of one update: where the checkpoint is, and its `train/*`, `perf/*` metrics."""

    out_dir: Path
    metrics: dict[str, float] = field(default_factory=dict)


OPTIMIZER_FILE = "optimizer.pt"  # AdamW's state between updates (optimizer_state: carry)


class NoSignalError(ValueError):
    """Every advantage is zero: the update would change nothing."""


# ---- data path (shared with SFT) -------------------------------------------------------------
@dataclass
class Batch:
    """Right-padded samples. Response tensors are shifted: position t scores token t+1."""

    input_ids: torch.Tensor  # (B, T)
    attention_mask: torch.Tensor  # (B, T)
    response_mask: torch.Tensor  # (B, T-1) float, 1 where token t+1 is the seat's own
    token_rewards: torch.Tensor  # (B, T-1) the seat's reward on its last own token
    temperature: torch.Tensor  # (B,) the temperature each row was sampled at
    # (B, T-1) the engine's log-prob of token t+1 on response positions, 0 elsewhere; NaN on
    # the rows without them (scripted seats, older samples); None when no row has them
    rollout_log_prob: torch.Tensor | None = None
    # (B,) the rows' prompt groups when the forward shares their prefixes (`share_prefix`)
    prefix_group: torch.Tensor | None = None

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    @property
    def scored(self) -> torch.Tensor:
        """(B,) bool: the rows that carry the engine's log-probs."""
        if self.rollout_log_prob is None:
            return torch.zeros(len(self), dtype=torch.bool)
        return ~self.rollout_log_prob.isnan().any(1)

    def micro_batches(
        self, rows: list[int], size: int, by_length: bool = True
    ) -> Iterator[list[int]]:
        """`rows` in chunks of `size`, longest rows first, so that each chunk pads to rows of
        similar length (46% of the tokens were padding in random chunks of `make run`'s
        rollouts, 23% fewer tokens sorted). A mini-batch's gradient does not depend on its
        split (losses are aggregated against the whole mini-batch) unless a loss term is
        taken per micro-batch (the transfer loss): `by_length` False keeps the given order.
        With `prefix_group` each micro-batch holds whole chunks of one prompt's rows
        (`prompt_chunks`), which the forward packs behind their shared prefix."""
        lengths = self.attention_mask.sum(1)  # (B,)
        if self.prefix_group is not None and by_length:
            return iter(prompt_chunks(rows, self.prefix_group.tolist(), lengths.tolist(), size))
        ordered = sorted(rows, key=lambda r: -int(lengths[r])) if by_length else rows
        return _chunks(ordered, size)

    def select(self, rows: list[int]) -> Batch:
        """Rows `rows`, trimmed to their longest sequence."""
        t = int(self.attention_mask[rows].sum(1).max())
        rollout = self.rollout_log_prob
        return Batch(
            self.input_ids[rows, :t],
            self.attention_mask[rows, :t],
            self.response_mask[rows, : t - 1],
            self.token_rewards[rows, : t - 1],
            self.temperature[rows],
            None if rollout is None else rollout[rows, : t - 1],
            None if self.prefix_group is None else self.prefix_group[rows],
        )

    def to(self, device: torch.device) -> Batch:
        rollout = self.rollout_log_prob
        return Batch(
            self.input_ids.to(device),
            self.attention_mask.to(device),
            self.response_mask.to(device),
            self.token_rewards.to(device),
            self.temperature.to(device),
            None if rollout is None else rollout.to(device),
            None if self.prefix_group is None else self.prefix_group.to(device),
        )


def prompt_chunks(
    rows: list[int], group: list[int], lengths: list[int], size: int
) -> list[list[int]]:
    """`rows` in micro-batches of at most `size` rows that keep each prompt group's rows
    together: each group's rows longest first in chunks of `size`, the chunks by total length,
    then as many whole chunks per micro-batch as fit."""
    chunks = [
        chunk
        for rs in shared_prefix.rows_by_group(group, rows)
        for chunk in _chunks(sorted(rs, key=lambda r: -lengths[r]), size)
    ]
    chunks.sort(key=lambda c: -sum(lengths[r] for r in c))
    out: list[list[int]] = []
    for chunk in chunks:
        if out and len(out[-1]) + len(chunk) <= size:
            out[-1] = out[-1] + chunk
        else:
            out.append(chunk)
    return out


def prompt_groups(df: pd.DataFrame) -> np.ndarray:
    """(B,) one id per prompt group: the rows one seat played from one game state (the same
    `init_id` and `seat`), whose conversations open with the same prompt."""
    missing = {"init_id", "seat"} - set(df.columns)
    if missing:
        raise ValueError(
            f"share_prefix and mini_batches: prompts group rows by init_id and seat, but the "
            f"samples have no {sorted(missing)} column; roll out again or turn them off"
        )
    return df.groupby(["init_id", "seat"], sort=False).ngroup().to_numpy()


def load_samples(paths: list[str | Path], policy: str | None) -> pd.DataFrame:
    """Samples parquets concatenated, keeping rows played by `policy` (None = all rows)."""
    df = read_samples(paths)  # checks the training columns exist
    if policy is not None and "policy" in df.columns:
        seen = sorted(df.policy.unique())
        df = df[df.policy == policy].reset_index(drop=True)
        if df.empty and seen:
            raise ValueError(
                f"no samples played by policy {policy!r} in {paths} (found {seen}); set the "
                "config's policy to one of those, or to null to train on every row"
            )
    if df.empty:
        raise ValueError(f"the samples in {paths} are empty: nothing to train on")
    return df


def drop_cut_rewards(df: pd.DataFrame, max_len: int | None) -> tuple[pd.DataFrame, int]:
    """Rows whose reward token survives a cut to `max_len` tokens, and how many were dropped.

    A row cut before its last own token would train as a zero-reward sample; it is dropped.
    """
    if max_len is None:
        return df, 0
    keep = [max(np.flatnonzero(np.asarray(m)), default=-1) < max_len for m in df.assistant_mask]
    kept = df[keep].reset_index(drop=True)
    if kept.empty:
        raise ValueError(
            f"every sample's last reply ends beyond max_seq_len={max_len}; raise max_seq_len"
        )
    return kept, len(df) - len(kept)


def collate(
    df: pd.DataFrame,
    pad_id: int | None,
    max_len: int | None = None,
    weights: np.ndarray | None = None,
) -> Batch:
    """Right-pad `input_ids`, `assistant_mask`, `token_rewards` into a `Batch`. `weights`
    (one per row) scale each row's response mask: a token-mean loss then counts a row of
    weight w as w copies of it."""
    rows = list(zip(df.input_ids, df.assistant_mask, df.token_rewards, strict=True))
    for i, (x, m, r) in enumerate(rows):
        if not len(x) == len(m) == len(r):
            raise ValueError(
                f"sample {i}: input_ids, assistant_mask and token_rewards have lengths "
                f"{len(x)}, {len(m)}, {len(r)}; they must be equal (rewrite it with the rollout)"
            )
    lengths = [min(len(x), max_len or len(x)) for x, _, _ in rows]
    b, t = len(rows), max(lengths)
    ids = torch.full((b, t), 0 if pad_id is None else pad_id, dtype=torch.long)  # (B, T)
    attn = torch.zeros(b, t, dtype=torch.long)  # (B, T)
    mask = torch.zeros(b, t)  # (B, T)
    rew = torch.zeros(b, t)  # (B, T)
    for i, ((x, m, r), n) in enumerate(zip(rows, lengths, strict=True)):
        ids[i, :n] = torch.as_tensor(np.array(x[:n], dtype=np.int64))
        attn[i, :n] = 1
        mask[i, :n] = torch.as_tensor(np.array(m[:n], dtype=np.float32))
        rew[i, :n] = torch.as_tensor(np.array(r[:n], dtype=np.float32))
    if weights is not None:
        mask *= torch.as_tensor(np.asarray(weights, np.float32))[:, None]
    if mask[:, 1:].sum() == 0:
        raise ValueError("no assistant tokens to train on (assistant_mask is 0 everywhere)")
    rollout = rollout_log_probs(df, lengths, t)
    return Batch(ids, attn, mask[:, 1:], rew[:, 1:], sampling_temperature(df), rollout)


def rollout_log_probs(df: pd.DataFrame, lengths: list[int], t: int) -> torch.Tensor | None:
    """(B, T-1) the samples' `rollout_log_probs` (aligned with `input_ids`, cut to `lengths`),
    shifted like the response mask; NaN rows where a row has none, None where no row has."""
    if "rollout_log_probs" not in df.columns:
        return None
    values = [None if v is None or np.ndim(v) == 0 else v for v in df.rollout_log_probs]
    if all(v is None for v in values):
        return None
    out = torch.zeros(len(df), t)  # (B, T)
    for i, (v, x, n) in enumerate(zip(values, df.input_ids, lengths, strict=True)):
        if v is None:
            out[i] = float("nan")
        elif len(v) != len(x):
            raise ValueError(
                f"sample {i}: rollout_log_probs has {len(v)} entries for {len(x)} input_ids; "
                "they must align (rewrite it with the rollout)"
            )
        else:
            out[i, :n] = torch.as_tensor(np.array(v[:n], dtype=np.float32))
    return out[:, 1:]


def sampling_temperature(df: pd.DataFrame) -> torch.Tensor:
    """(B,) the temperature each row was sampled at (the samples' `temperature` column; 1 for
    scripted play and samples written before the column existed). Log-probs of top-p or greedy
    samples are not those of any softmax we can compute, so they are refused."""
    if "top_p" in df.columns and (df.top_p < 1).any():
        raise ValueError(
            "samples were drawn with top_p < 1: their log-probs are not the model's softmax, so "
            "GRPO's ratio would be biased; roll out with sampling.top_p: 1"
        )
    temps = df["temperature"].fillna(1.0) if "temperature" in df.columns else 1.0
    temps = torch.as_tensor(np.broadcast_to(np.asarray(temps, np.float32), len(df)).copy())
    if (temps <= 0).any():
        raise ValueError("samples were drawn greedily (temperature 0): there is no policy ratio "
                         "to train on; roll out with sampling.temperature > 0")  # fmt: skip
    return temps  # (B,)


def load_model(
    path: str | Path, device: torch.device, trainable: bool = True, cfg: OptimConfig | None = None
):
    """A HF causal LM on `device`, in eval mode: dropout stays off so that training log-probs
    match the sampling policy's (gradients still flow when `trainable`). `cfg` sets its dtype,
    gradient checkpointing and LoRA (float32, plain, full fine-tuning without it)."""
    return policy_model.load_policy(path, device, cfg, trainable)


def token_log_probs(
    model: torch.nn.Module, batch: Batch, with_entropy: bool = False, entropy_grad: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log p(token t+1 | prefix) (B, T-1) and, if asked, the policy entropy (B, T-1), on the
    `response_mask` positions only (0 elsewhere), without a (B, T, V) log-softmax
    (sparring.logprobs)."""
    return logprobs.token_log_probs(
        model,
        batch.input_ids,
        batch.attention_mask,
        batch.response_mask,
        with_entropy,
        entropy_grad,
        temperature=batch.temperature,
        prefix_group=batch.prefix_group,
    )


def prompt_scores(
    model: torch.nn.Module, batch: Batch, entropy_grad: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`token_log_probs` with the entropy, and each row's mean final hidden state over its
    prompt tokens (B, H): the attended tokens that are not the seat's own, from the same
    forward pass (the transfer loss's input)."""
    own = torch.nn.functional.pad(batch.response_mask, (1, 0))  # (B, T): token 0 is never own
    prompt = batch.attention_mask * (1 - own)  # (B, T)
    log_prob, entropy, pooled = logprobs.token_scores(
        model, batch.input_ids, batch.attention_mask, batch.response_mask, True, entropy_grad,
        temperature=batch.temperature, pool_mask=prompt,
    )  # fmt: skip
    return log_prob, entropy, pooled


def batched_log_probs(model, batch: Batch, rows, cfg: OptimConfig, device) -> torch.Tensor:
    """No-grad log-probs of `rows` in micro-batches, right-padded to (len(rows), T-1) on CPU."""
    rows = list(rows)
    at = {row: i for i, row in enumerate(rows)}  # the output's line of each row
    out = torch.zeros(len(rows), batch.response_mask.shape[1])  # (R, T-1)
    with torch.no_grad(), _autocast(cfg, device), heap.reusing_model(model):
        for chunk in batch.micro_batches(rows, cfg.micro_batch_size):
            lp, _ = token_log_probs(model, batch.select(chunk).to(device))  # (b, t)
            out[[at[r] for r in chunk], : lp.shape[1]] = lp.float().cpu()
    return out


def schedule(
    n: int, cfg: OptimConfig, labels: list[Any] | None = None, prompts: list[int] | None = None
) -> list[list[int]]:
    """Row indices of every optimizer step: `epochs` shuffled passes in mini-batches; with
    `labels` (one per row: GRPO's `balance_by` column) each pass is `balanced_order`, so each
    mini-batch holds equally many rows of every label, up to one, while every label has rows
    left (a label with fewer rows runs out first, and the last mini-batches hold the rest).
    With `prompts` (one prompt group per row: `mini_batches: prompts`) each pass is
    `prompt_pass`: chunks of one prompt's rows, in shuffled order."""
    if labels is not None and len(labels) != n:
        raise ValueError(f"{len(labels)} labels for {n} rows")
    gen = torch.Generator().manual_seed(cfg.seed)
    if prompts is not None:
        return [mini for _ in range(cfg.epochs) for mini in prompt_pass(prompts, cfg, gen)]
    passes = [
        balanced_order(labels, gen)
        if labels is not None
        else torch.randperm(n, generator=gen).tolist()
        for _ in range(cfg.epochs)
    ]
    return [mini for order in passes for mini in _chunks(order, cfg.mini_batch_size)]


def prompt_pass(prompts: list[int], cfg: OptimConfig, gen: torch.Generator) -> list[list[int]]:
    """One pass in mini-batches of prompt chunks: each prompt group's rows shuffled and cut
    into chunks of `micro_batch_size` rows, the chunks in shuffled order, as many whole chunks
    per mini-batch as `mini_batch_size` rows hold. A micro-batch then holds one prompt's rows,
    whose shared prefix `share_prefix` runs once."""
    chunks = [
        chunk
        for rows in shared_prefix.rows_by_group(prompts, range(len(prompts)))
        for chunk in _chunks(
            [rows[j] for j in torch.randperm(len(rows), generator=gen).tolist()],
            cfg.micro_batch_size,
        )
    ]
    minis: list[list[int]] = []
    for k in torch.randperm(len(chunks), generator=gen).tolist():
        if minis and len(minis[-1]) + len(chunks[k]) <= cfg.mini_batch_size:
            minis[-1] = minis[-1] + chunks[k]
        else:
            minis.append(list(chunks[k]))
    return minis


def balanced_order(labels: list[Any], gen: torch.Generator) -> list[int]:
    """One pass over the rows in which the labels take turns: each label's rows shuffled, the
    labels in a shuffled order kept for the whole pass, then round robin (a label leaves the
    turn when its rows run out). Any run of consecutive rows taken while every label still has
    rows holds each label equally often, up to one (seed 001's country-balanced sampler,
    without its repeats: every row once)."""
    rows: dict[str, list[int]] = {}
    for i, label in enumerate(labels):
        rows.setdefault(str(label), []).append(i)
    names = sorted(rows)
    turn = [names[k] for k in torch.randperm(len(names), generator=gen).tolist()]
    queues = [
        [rows[k][j] for j in torch.randperm(len(rows[k]), generator=gen).tolist()] for k in turn
    ]
    longest = max((len(q) for q in queues), default=0)
    return [q[r] for r in range(longest) for q in queues if r < len(q)]


MicroLoss = Callable[..., tuple[torch.Tensor, dict[str, float | torch.Tensor]]]
OnStep = Callable[[int, dict[str, float]], None]  # (optimizer step, its metrics), e.g. to MLflow


def optimize(
    model,
    batch: Batch,
    plan: list[list[int]],
    cfg: OptimConfig,
    device: torch.device,
    micro_loss: MicroLoss,
    desc: str,
    actor_cfg: Any,
    on_step: OnStep | None = None,
    carry: dict[str, Any] | None = None,
    span: int = 1,
    by_length: bool = True,
    update: int = 0,
) -> dict[str, float]:
    """AdamW steps over the mini-batches in `plan`, accumulating grads over micro-batches.

    `carry`, when given, is the optimizer state to continue (`{"optimizer": AdamW state,
    "step": steps taken}`, empty for a first update) and receives the state after the last
    step; a cosine schedule then spans `span` updates of `len(plan)` steps. Without `carry` a
    fresh AdamW takes the `update % span`-th share of that schedule (`update`: this update's
    index in the run), so a schedule over the run also anneals LoRA updates.

    `micro_loss(model, micro_batch, rows, actor_cfg)` returns (loss, diagnostics). Losses are
    aggregated with verl's `agg_loss` against the whole mini-batch (`actor_cfg`, a verl
    `ActorConfig`, whose `global_batch_info` is set per mini-batch), so the accumulated
    gradient is the mini-batch loss's gradient. `on_step(step, metrics)` gets each optimizer
    step's loss, grad norm, token-weighted diagnostics and tokens/s as soon as it is taken.
    `by_length` cuts each mini-batch into micro-batches longest rows first
    (`Batch.micro_batches`).
    """
    params = policy_model.trainable_parameters(model)  # all weights, or only LoRA's
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    start = 0
    if carry:
        opt.load_state_dict(carry["optimizer"])
        start = int(carry["step"])
    elif carry is None:  # fresh: where this update's steps lie in the run's schedule
        start = (update % span) * len(plan)

    def lr_factor(step: int) -> float:
        done = min((start + step) / (len(plan) * span), 1.0)
        return 0.5 * (1 + math.cos(math.pi * done)) if cfg.lr_schedule == "cosine" else 1.0

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_factor)
    sums: dict[str, float] = {}
    weight, tokens, losses, norms, lrs = 0.0, 0, [], [], []
    t0 = time.perf_counter()
    bar = tqdm(plan, desc=desc, unit="step")
    for step, mini in enumerate(bar):
        grpo.set_global_batch(actor_cfg, batch.select(mini).response_mask)
        opt.zero_grad(set_to_none=True)
        loss_sum, step_sums, step_weight, step_tokens = 0.0, {}, 0.0, 0
        t_step = time.perf_counter()
        with heap.reusing_model(model):  # each micro-batch reuses the last one's pages
            for rows in batch.micro_batches(mini, cfg.micro_batch_size, by_length):
                mb = batch.select(rows).to(device)
                with _autocast(cfg, device):
                    loss, diag = micro_loss(model, mb, rows, actor_cfg)
                loss.backward()
                loss_sum += float(loss.detach())
                step_tokens += int(mb.attention_mask.sum())
                w = float(mb.response_mask.sum())  # diagnostics are token-weighted means
                step_weight += w
                if w:
                    for k, v in diag.items():
                        step_sums[k] = step_sums.get(k, 0.0) + float(v) * w
        grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
        if not torch.isfinite(grad_norm):
            raise FloatingPointError(f"grad norm is {grad_norm}; lower lr ({cfg.lr}) or check data")
        lrs.append(opt.param_groups[0]["lr"])  # the step's, before the schedule moves on
        opt.step()
        sched.step()
        losses.append(loss_sum)
        norms.append(float(grad_norm))
        tokens, weight = tokens + step_tokens, weight + step_weight
        for k, v in step_sums.items():
            sums[k] = sums.get(k, 0.0) + v
        if on_step is not None:
            on_step(
                step,
                {k: v / max(step_weight, 1.0) for k, v in step_sums.items()}
                | {"loss": loss_sum, "grad_norm": norms[-1], "lr": lrs[-1]}
                | {"tokens_per_second": step_tokens / (time.perf_counter() - t_step)},
            )
        bar.set_postfix(loss=f"{loss_sum:.4f}", grad_norm=f"{norms[-1]:.3f}")
    seconds = time.perf_counter() - t0
    if carry is not None:
        carry.update(optimizer=opt.state_dict(), step=start + len(plan))
    return {
        **{f"train/{k}": v / max(weight, 1.0) for k, v in sums.items()},
        "train/loss": float(np.mean(losses)),
        "train/lr": float(np.mean(lrs)),  # the update's mean step size (lr_schedule)
        "train/grad_norm": float(np.mean(norms)),
        "train/optimizer_steps": float(len(plan)),
        "perf/train_seconds": seconds,
        "perf/train_tokens_per_second": tokens / seconds,
    }


def save_checkpoint(model, tokenizer, out_dir: str | Path, metrics: dict[str, float]) -> Path:
    """A HF checkpoint (safetensors, config, tokenizer) the rollout loads, plus metrics.json;
    in the training dtype, with LoRA adapters merged."""
    return policy_model.save_policy(model, tokenizer, out_dir, metrics)


def load_optimizer(folder: str | Path | None) -> dict[str, Any]:
    """The optimizer state in `folder` (`optimizer.pt`); empty if there is none yet."""
    path = Path(folder) / OPTIMIZER_FILE if folder else None
    if path is None or not path.is_file():
        return {}
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # a truncated or foreign file: say which, don't train on it
        raise ValueError(f"{path} is not an optimizer state ({e}); delete it to start fresh") from e


def save_optimizer(carry: dict[str, Any], folder: str | Path) -> Path:
    """Write the optimizer state to `folder/optimizer.pt` (atomically: a retry never reads half)."""
    path = Path(folder) / OPTIMIZER_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save(carry, tmp)
    tmp.replace(path)
    return path


def _chunks(items: list[int], size: int) -> Iterator[list[int]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def _autocast(cfg: OptimConfig, device: torch.device):
    """bf16 autocast on CUDA when `cfg.bf16`, on CPU when `cfg.cpu_bf16` says so
    (`peak_flops.cpu_bf16`), a no-op elsewhere."""
    if device.type == "cuda":
        enabled = cfg.bf16 and torch.cuda.is_bf16_supported()
    else:
        enabled = device.type == "cpu" and peak_flops.cpu_bf16(cfg.cpu_bf16)
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=enabled)


def advantages_for(
    df: pd.DataFrame, batch: Batch, cfg: GRPOConfig, baseline: RoleBaseline | None = None
):
    """Step 4: advantages (B, T-1) under `cfg.group_key` (or, with `advantage: rae`, against
    `baseline`, which this batch updates), and their stats for every group key.

    Raises NoSignalError (naming what to change) when all advantages are zero.
    """
    scores = batch.token_rewards.sum(1).numpy()  # (B,)
    n_tokens = batch.response_mask.sum(1).clamp(min=1)  # (B,)
    metrics: dict[str, float] = {"train/reward_mean": float(scores.mean())}
    chosen = grpo.group_index(df, cfg.group_key)  # raises when the key is not a column
    advantages = torch.zeros_like(batch.response_mask)  # (B, T-1), set by the chosen key
    others = [k for k in GENERIC_GROUP_KEYS if k != cfg.group_key and (k == "batch" or k in df)]
    for key, index in [(cfg.group_key, chosen)] + [(k, grpo.group_index(df, k)) for k in others]:
        adv = grpo.grpo_advantages(
            batch.token_rewards,
            batch.response_mask,
            index,
            cfg.norm_adv_by_std,
            cfg.singleton_groups,
        )  # (B, T-1)
        seq_adv = ((adv * batch.response_mask).sum(1) / n_tokens).numpy()  # (B,)
        metrics |= grpo.advantage_stats(scores, index, seq_adv, key)
        advantages = adv if key == cfg.group_key else advantages
    if cfg.advantage == "rae":
        baseline = baseline or RoleBaseline(cfg.rae_decay)
        seq_adv = baseline.advantages(grpo.group_index(df, cfg.rae_key), scores)  # (B,)
        advantages = torch.from_numpy(seq_adv).float()[:, None] * batch.response_mask
        metrics |= baseline.metrics()
    if cfg.rejected_credit != "episode" and "rejected_mask" in df:
        advantages, metrics["train/rejected_token_frac"] = credit_rejected(
            df, batch, cfg, advantages
        )
    if not advantages.abs().sum() > 0:
        raise NoSignalError(
            f"all {len(df)} samples have zero advantage under group_key={cfg.group_key!r}: every "
            f"group's rewards are equal, or groups have size 1 (singleton_groups="
            f"{cfg.singleton_groups!r}); raise the sampling temperature or games_per_init, or use "
            "a coarser group key such as 'batch'"
        )
    metrics["train/frac_reward_zero_std"] = metrics[f"train/{cfg.group_key}/frac_reward_zero_std"]
    return advantages, metrics


def credit_rejected(
    df: pd.DataFrame, batch: Batch, cfg: GRPOConfig, advantages: torch.Tensor
) -> tuple[torch.Tensor, float]:
    """`advantages` (B, T-1) with the tokens of rejected replies credited as
    `cfg.rejected_credit` says, and the share of response tokens they are."""
    rejected = torch.zeros_like(batch.response_mask, dtype=torch.bool)  # (B, T-1)
    for i, mask in enumerate(df["rejected_mask"]):
        shifted = torch.as_tensor(list(mask[1:]), dtype=torch.bool)[: rejected.shape[1]]
        rejected[i, : len(shifted)] = shifted  # position t scores token t + 1, as in collate
    rejected &= batch.response_mask.bool()
    if cfg.rejected_credit == "exclude":
        credited = torch.where(rejected, advantages.clamp(max=0.0), advantages)
    else:
        credited = torch.where(
            rejected, torch.full_like(advantages, cfg.rejected_penalty), advantages
        )
    share = float(rejected.sum() / batch.response_mask.sum().clamp(min=1))
    return credited, share


def drop_silent_groups(
    df: pd.DataFrame, batch: Batch, advantages: torch.Tensor, key: str
) -> tuple[pd.DataFrame, Batch, torch.Tensor, dict[str, float]]:
    """Dynamic sampling (DAPO): only the groups under `key` that carry signal (a nonzero
    advantage somewhere: `grpo.signal_rows`). Returns their rows, batch and advantages
    (B', T'-1), and `train/dropped_groups` (how many groups left) and
    `train/dropped_group_frac` (their share of the groups)."""
    index = grpo.group_index(df, key)  # (B,)
    keep = grpo.signal_rows(index, advantages)  # (B,)
    groups, dropped = len(set(index)), len(set(index[~keep]))
    rows = np.flatnonzero(keep).tolist()
    kept = batch.select(rows)  # trimmed to its longest row
    metrics = {"train/dropped_groups": float(dropped), "train/dropped_group_frac": dropped / groups}
    kept_df = df.iloc[rows].reset_index(drop=True)
    return kept_df, kept, advantages[rows, : kept.response_mask.shape[1]], metrics


def signal_groups(df: pd.DataFrame, cfg: GRPOConfig) -> int:
    """How many groups under `cfg.group_key` carry signal (a nonzero advantage) in an update of
    `cfg` on the samples `df`: the groups dynamic sampling keeps, counted as `train` would (the
    rows of `cfg.policy`, cut to `cfg.max_seq_len`), which the rollout's top-up counts."""
    if cfg.policy is not None and "policy" in df.columns:
        df = df[df.policy == cfg.policy].reset_index(drop=True)
    if df.empty:
        return 0
    df, _ = drop_cut_rewards(df, cfg.max_seq_len)
    # advantages need only the rewards and masks: leave the sampling columns out of the batch
    scoring = ["temperature", "top_p", "rollout_log_probs"]
    batch = collate(df.drop(columns=scoring, errors="ignore"), None, cfg.max_seq_len)
    try:
        advantages, _ = advantages_for(df, batch, cfg)
    except NoSignalError:
        return 0
    index = grpo.group_index(df, cfg.group_key)
    return len(set(index[grpo.signal_rows(index, advantages)]))


def transfer_roles(df: pd.DataFrame, cfg: GRPOConfig) -> list[str] | None:
    """The rows' `role` values, which the transfer loss pairs (None when it is off); a
    ValueError when the samples have no role column or none of `cfg.transfer_pairs`' roles."""
    if not cfg.transfer_weight:
        return None
    wanted = {r for pair in cfg.transfer_pairs or () for r in pair}
    if "role" not in df.columns or wanted.isdisjoint(df.role):
        found = sorted(df.role.unique()) if "role" in df.columns else "no role column"
        raise ValueError(
            f"transfer_pairs {cfg.transfer_pairs} name no role of these samples ({found}); "
            "name the samples' roles, or set transfer_weight: 0"
        )
    return df.role.astype(str).tolist()


def balance_labels(df: pd.DataFrame, cfg: GRPOConfig) -> list[Any] | None:
    """The rows' `cfg.balance_by` values (None when off); a ValueError if the samples lack
    the column."""
    if cfg.balance_by is None:
        return None
    if cfg.balance_by not in df.columns:
        raise ValueError(
            f"balance_by {cfg.balance_by!r} is not a samples column; choose one of "
            f"{sorted(c for c in df.columns if df[c].map(type).eq(str).all())}"
        )
    return df[cfg.balance_by].tolist()


def grpo_update(
    model: torch.nn.Module,
    batch: Batch,
    advantages: torch.Tensor,  # (B, T-1)
    cfg: GRPOConfig,
    device: torch.device,
    ref_model: torch.nn.Module | None = None,
    on_step: OnStep | None = None,
    carry: dict[str, Any] | None = None,
    labels: list[Any] | None = None,
    roles: list[str] | None = None,
    update: int = 0,
    prompts: list[int] | None = None,
) -> dict[str, float]:
    """Steps 2, 3, 5 and 6's mismatch on a loaded model: old/ref log-probs, then PPO epochs
    over mini-batches balanced by `labels` (the rows' `balance_by` values) if given, with the
    transfer loss over the rows' `roles` when `cfg.transfer_weight` > 0; `update` is this
    update's index in the run (the lr schedule's place, see `optimize`); `prompts` (the rows'
    prompt groups) makes mini-batches of whole groups. Returns metrics."""
    if cfg.transfer_weight and roles is None:
        raise ValueError("transfer_weight > 0 needs the rows' roles (train.transfer_roles)")
    plan = schedule(len(batch), cfg, labels, prompts)
    rollout = batch.rollout_log_prob  # (B, T-1), NaN rows where unknown, or None
    if (cfg.bypass_mode or cfg.rollout_is) and not batch.scored.all():
        raise ValueError(
            f"{'bypass_mode' if cfg.bypass_mode else 'rollout_is'} needs the rollout's "
            f"log-probs, but {int((~batch.scored).sum())} of {len(batch)} samples have no "
            "rollout_log_probs (scripted seats, or samples from an older rollout); roll out "
            "again, or set rollout_is: null and bypass_mode: false"
        )
    # 2. old log-probs. `start_log_prob`: the start weights' own, from a no-grad pass for rows
    # outside the first mini-batch and from the first mini-batch's forward for its rows
    # (filled lazily there); bypass mode skips the pass and takes the engine's instead.
    t_passes = time.perf_counter()
    start_log_prob = torch.zeros_like(batch.response_mask)  # (B, T-1)
    pending = torch.zeros(len(batch), dtype=torch.bool)  # (B,) rows the first step fills
    pending[plan[0]] = True
    later = (~pending).nonzero()[:, 0].tolist()
    if later and not cfg.bypass_mode:
        start_log_prob[later] = batched_log_probs(model, batch, later, cfg, device)
    old_log_prob = rollout.clone() if cfg.bypass_mode else start_log_prob  # (B, T-1)
    # 3. reference log-probs: the start weights are `old_log_prob` itself (same tensor)
    ref_log_prob = None
    if cfg.kl_coef > 0:
        ref_log_prob = old_log_prob
        if ref_model is not None:
            ref_log_prob = batched_log_probs(ref_model, batch, range(len(batch)), cfg, device)
    passes = time.perf_counter() - t_passes

    state_w, metrics = None, {}  # (B, T-1) per-token weights of the decision states
    if cfg.state_balance:
        state_w, metrics = grpo.state_weights(
            batch.input_ids, batch.response_mask, cfg.state_balance
        )

    def micro_loss(model, mb: Batch, rows: list[int], actor_cfg) -> tuple[torch.Tensor, dict]:
        if cfg.transfer_weight:  # the prompts' mean hidden states too, from the same forward
            log_prob, entropy, pooled = prompt_scores(model, mb, cfg.entropy_coef > 0)
        else:
            log_prob, entropy = token_log_probs(model, mb, True, cfg.entropy_coef > 0)
        t, dev = log_prob.shape[1], log_prob.device
        if pending[rows].any():  # first mini-batch: these weights are still the start weights
            start_log_prob[rows, :t] = log_prob.detach().float().cpu()
            pending[rows] = False
        old, adv = old_log_prob[rows, :t].to(dev), advantages[rows, :t].to(dev)  # (b, t)
        state = None if state_w is None else state_w[rows, :t].to(dev)  # (b, t)
        weights, diag = state, {}
        if cfg.rollout_is:  # truncated importance sampling: verl's weights on each token's loss
            weights, diag = rollout_correction.is_weights(
                old, mb.rollout_log_prob, mb.response_mask, cfg.rollout_is, cfg.rollout_is_threshold
            )  # (b, t)
            weights = weights if state is None else weights * state
        loss, pg_diag = grpo.policy_loss(log_prob, old, adv, mb.response_mask, actor_cfg, weights)
        diag |= pg_diag
        if ref_log_prob is not None:
            ref = ref_log_prob[rows, :t].to(dev)  # (b, t)
            kl, diag["kl"] = grpo.kl_loss(
                log_prob, ref, mb.response_mask, cfg.kl_type, actor_cfg, state
            )
            loss = loss + cfg.kl_coef * kl
        if cfg.entropy_coef > 0:
            bonus = entropy if state is None else entropy * state
            loss = loss - cfg.entropy_coef * grpo.aggregate(bonus, mb.response_mask, actor_cfg)
        diag["entropy"] = (entropy.detach() * mb.response_mask).sum() / mb.response_mask.sum()
        if cfg.transfer_weight:
            loss = transfer_term(loss, pooled, [roles[i] for i in rows], cfg, actor_cfg, diag)
        return loss, diag

    # 5. PPO epochs
    metrics |= optimize(
        model,
        batch,
        plan,
        cfg,
        device,
        micro_loss,
        "grpo",
        grpo.actor_config(
            cfg.clip_ratio, cfg.clip_ratio_high, cfg.loss_agg_mode, cfg.loss_scale_factor
        ),
        on_step,
        carry,
        cfg.lr_schedule_updates,
        by_length=not cfg.transfer_weight,  # the transfer loss pairs rows within a micro-batch
        update=update,
    )
    metrics["perf/log_prob_pass_seconds"] = passes  # steps 2 and 3, part of the update's time
    metrics["perf/train_seconds"] += passes
    # 6. the mismatch, over the rows with the engine's log-probs and the start weights' (every
    # row; in bypass mode only the first mini-batch's, the only ones the start weights scored)
    measured = batch.scored.clone()  # (B,)
    if cfg.bypass_mode:
        measured[later] = False
    if measured.any():
        mismatch = rollout_correction.mismatch_metrics(
            start_log_prob[measured], rollout[measured], batch.response_mask[measured]
        )
        metrics |= {f"train/{k}": v for k, v in mismatch.items()}
    return metrics


def transfer_term(
    loss: torch.Tensor,
    pooled: torch.Tensor,  # (b, H) the micro-batch's prompt means (`prompt_scores`)
    roles: list[str],  # (b,)
    cfg: GRPOConfig,
    actor_cfg: Any,
    diag: dict[str, Any],
) -> torch.Tensor:
    """`loss` + transfer_weight x the micro-batch's transfer loss (sparring.grpo.transfer_loss)
    x its share of the mini-batch's rows, so that the micro-batches' terms add up to one
    mini-batch's; the distance, the term's share of the loss's size and the pairs present go
    to `diag` (`train/transfer_loss`, `train/transfer_share`, `train/transfer_pairs`)."""
    distance, present = grpo.transfer_loss(pooled, roles, cfg.transfer_pairs or [])
    rows_share = len(roles) / max(actor_cfg.global_batch_info["global_batch_size"], 1)
    term = cfg.transfer_weight * rows_share * distance
    size = term.detach().abs() + loss.detach().abs()
    diag["transfer_loss"] = distance.detach()
    diag["transfer_share"] = term.detach().abs() / size if size > 0 else size
    diag["transfer_pairs"] = float(present)
    return loss + term


def train(
    model_path: str | Path,
    samples_paths: list[str | Path],
    out_dir: str | Path,
    cfg: GRPOConfig | None = None,
    ref_model_path: str | Path | None = None,
    on_step: OnStep | None = None,
    device: str = "auto",
    optimizer_in: str | Path | None = None,
    optimizer_out: str | Path | None = None,
    update: int = 0,
) -> TrainStats:
    """One GRPO update of `model_path` on rollout samples, on `device` (cpu, cuda, cuda:N or
    auto); writes a checkpoint to `out_dir`.

    The reference policy for KL is `ref_model_path` if given, else `model_path` itself;
    `on_step` sees every optimizer step's metrics (see `optimize`). With `optimizer_state:
    carry`, AdamW continues from `optimizer_in` (the previous update's `optimizer_out`; none
    for a first update) and its state is written to `optimizer_out`. `update` (iteration −
    first_iteration) places a fresh AdamW's steps in a schedule over `lr_schedule_updates`.
    """
    cfg = cfg or GRPOConfig()
    if ref_model_path is not None and cfg.kl_coef == 0:
        raise ValueError("a reference model is only used when kl_coef > 0; set kl_coef or drop it")
    torch.manual_seed(cfg.seed)
    device = pick_device(device)
    # 1. samples -> tensors
    df, dropped = drop_cut_rewards(load_samples(samples_paths, cfg.policy), cfg.max_seq_len)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    batch = collate(df, tokenizer.pad_token_id, cfg.max_seq_len)
    # 4. advantages first: cheap, and fail fast when there is nothing to learn
    baseline = RoleBaseline.load(model_path, cfg.rae_decay) if cfg.advantage == "rae" else None
    advantages, metrics = advantages_for(df, batch, cfg, baseline)
    metrics |= {"train/dropped_groups": 0.0, "train/dropped_group_frac": 0.0}
    if cfg.dynamic_sampling:  # DAPO: the groups without signal leave the update
        df, batch, advantages, dropped_groups = drop_silent_groups(
            df, batch, advantages, cfg.group_key
        )
        metrics |= dropped_groups
    labels, roles = balance_labels(df, cfg), transfer_roles(df, cfg)
    prompts = None
    if cfg.share_prefix or cfg.mini_batches == "prompts":
        groups = prompt_groups(df)
        prompts = groups.tolist() if cfg.mini_batches == "prompts" else None
        if cfg.share_prefix:
            batch.prefix_group = torch.tensor(groups)
    metrics["train/samples"] = float(len(df))
    metrics["train/dropped_rows"] = float(dropped)
    model = load_model(model_path, device, cfg=cfg)
    ref_model = None
    if ref_model_path:
        ref_model = load_model(ref_model_path, device, trainable=False, cfg=cfg)
    carry = load_optimizer(optimizer_in) if cfg.optimizer_state == "carry" else None
    metrics |= grpo_update(
        model, batch, advantages, cfg, device, ref_model, on_step, carry, labels, roles, update,
        prompts,
    )  # fmt: skip
    if carry is not None and optimizer_out is not None:
        save_optimizer(carry, optimizer_out)
    # 6. checkpoint (with the RAE baselines the next update starts from)
    saved = save_checkpoint(model, tokenizer, out_dir, metrics)
    if baseline is not None:
        baseline.save(saved)
    return TrainStats(saved, metrics)
