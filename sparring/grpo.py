"""GRPO math on verl's own core algorithms: group keys, advantages, policy and KL losses.

All tensors here are token-aligned "response" tensors of shape (B, T): position t scores the
prediction of token t+1, and `response_mask` is 1 only on the seat's own generated tokens.

Group keys (`group_index`): `game` (both seats of one game), `init` (every play of the same
initial state), `role` / `country` (every episode of the same seat), `batch` (one group), or
any other samples column.

Size-1 groups. verl's `compute_grpo_outcome_advantage` gives a singleton group mean 0 and
std 1, i.e. advantage = its raw score: with rewards in [0, 1] that pushes up every positive
reward with no baseline at all. Sparring handles singletons on purpose (`singleton`):
    "zero"   (default) no learning signal from a sample that has nothing to be compared with
    "batch"  compare it with the whole batch instead (batch mean, and batch std if normalizing);
             a batch of one row gets zero
Ties. A group whose rewards span less than `TIE_TOLERANCE` carries no signal and gets
advantage exactly 0 (verl's float32 statistics would leave rounding noise, e.g. +0.056 on each
of 16 rewards of 0.7); a batch of only such groups is `NoSignalError` in the trainer, and
dynamic sampling drops such groups from the update (`signal_rows`).
The transfer loss (`transfer_loss`, seed 001's cross-country transfer) is Sparring's own: an
auxiliary term on hidden states, with nothing in verl to take it from; so are the decision
states' weights (`state_weights`), which verl's losses take as per-token weights.
Losses take verl's `ActorConfig` (`actor_config`), whose `global_batch_info` carries the
mini-batch's token and sequence counts, so micro-batch losses add up to the mini-batch loss
exactly as in verl's own gradient accumulation.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch
from verl.trainer.ppo import core_algos
from verl.workers.config import ActorConfig

from sparring.samples import reply_spans

SINGLETON_POLICIES = ("zero", "batch")
TIE_TOLERANCE = 1e-6  # rewards of a group closer than this tie: no signal


def group_index(df: pd.DataFrame, key: str) -> np.ndarray:
    """Group label per row for `key` (`batch` = a single group), as verl's `index` (B,)."""
    if key == "batch":
        return np.full(len(df), "batch", dtype=object)
    if key not in df.columns:
        raise ValueError(
            f"group key {key!r} is not a samples column; use 'batch' or one of {sorted(df.columns)}"
        )
    return df[key].astype(str).to_numpy(dtype=object)


def grpo_advantages(
    token_rewards: torch.Tensor,  # (B, T)
    response_mask: torch.Tensor,  # (B, T)
    index: np.ndarray,  # (B,)
    norm_by_std: bool = True,
    singleton: str = "zero",
    tie_tolerance: float = TIE_TOLERANCE,
) -> torch.Tensor:
    """Per-token advantages (B, T) from verl's `compute_grpo_outcome_advantage`.

    A group whose rewards span less than `tie_tolerance` gets exactly 0: verl's float32 mean
    and std of 16 rewards of 0.7 leave each row +0.056, a signal made of rounding error.
    """
    if singleton not in SINGLETON_POLICIES:
        raise ValueError(
            f"unknown singleton policy {singleton!r}; choose from {SINGLETON_POLICIES}"
        )
    advantages, _ = core_algos.compute_grpo_outcome_advantage(
        token_level_rewards=token_rewards,
        response_mask=response_mask,
        index=index,
        norm_adv_by_std_in_grpo=norm_by_std,
    )  # (B, T)
    scores = token_rewards.sum(-1).numpy()  # (B,)
    _, inverse, counts = np.unique(index.astype(str), return_inverse=True, return_counts=True)
    tied = reward_spread(scores, inverse)[inverse] < tie_tolerance  # (B,); singletons too
    lonely = counts[inverse] == 1  # (B,)
    if singleton == "batch" and lonely.any() and len(index) > 1:
        whole, _ = core_algos.compute_grpo_outcome_advantage(
            token_level_rewards=token_rewards,
            response_mask=response_mask,
            index=np.full(len(index), "batch", dtype=object),
            norm_adv_by_std_in_grpo=norm_by_std,
        )  # (B, T)
        advantages[lonely] = whole[lonely]
        tied[lonely] = np.ptp(scores) < tie_tolerance  # compared with the whole batch
    advantages[torch.from_numpy(tied)] = 0.0
    return advantages


def signal_rows(index: np.ndarray, advantages: torch.Tensor) -> np.ndarray:
    """(B,) bool: the rows whose group (`index` (B,)) has a nonzero advantage somewhere in
    `advantages` (B, T). Dynamic sampling (DAPO) keeps these and drops the other groups, whose
    rows would add nothing to the policy gradient."""
    live = (advantages != 0).any(1).cpu().numpy()  # (B,)
    _, inverse = np.unique(index.astype(str), return_inverse=True)
    group_live = np.zeros(int(inverse.max()) + 1 if len(inverse) else 0, dtype=bool)
    np.logical_or.at(group_live, inverse, live)
    return group_live[inverse]


def reward_spread(scores: np.ndarray, inverse: np.ndarray) -> np.ndarray:
    """max - min of `scores` (B,) within each group (`inverse` (B,): group number per row)."""
    n = int(inverse.max()) + 1 if len(inverse) else 0
    hi, lo = np.full(n, -np.inf), np.full(n, np.inf)
    np.maximum.at(hi, inverse, scores)
    np.minimum.at(lo, inverse, scores)
    return hi - lo


def state_weights(
    input_ids: torch.Tensor,  # (B, T)
    response_mask: torch.Tensor,  # (B, T-1)
    balance: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Per-token loss weights (B, T-1) that even out how often the batch visits each decision
    state, and their diagnostics.

    A decision state is a reply's exact prefix: the token ids its seat had seen when it wrote
    it (in Kuhn Poker, the card and the bets so far: one of the game's 12 information states;
    in a game whose histories never repeat, every reply is its own state). Each reply's tokens
    weigh count ** -balance, count = the batch's replies with that prefix, scaled so that the
    replies' weights average 1: balance 0 weighs every reply alike (the plain update), 1 gives
    every state the same total weight however rarely play reaches it. Positive weights per
    state leave the update's fixed points where they were; they change how fast a rarely
    visited state moves, which otherwise gets a gradient in proportion to its visits.
    """
    ids = input_ids.cpu().numpy()
    replies = []  # (row, start, end, prefix): response positions [start, end) of one reply
    for i, row in enumerate(response_mask.cpu().numpy()):
        for a, b in reply_spans(row.tolist()):
            replies.append((i, a, b, ids[i, : a + 1].tobytes()))  # token a+1 is its first
    counts = Counter(prefix for *_, prefix in replies)
    raw = np.array([counts[prefix] ** -balance for *_, prefix in replies], dtype=np.float64)
    raw /= raw.mean()
    weights = torch.zeros_like(response_mask)
    for (i, a, b, _), w in zip(replies, raw, strict=True):
        weights[i, a:b] = float(w)
    return weights, {
        "train/decision_states": float(len(counts)),
        "train/state_visits_min": float(min(counts.values())),
        "train/state_weight_max": float(raw.max()),
    }


def actor_config(
    clip_ratio: float,
    clip_ratio_high: float | None,
    loss_agg_mode: str,
    loss_scale_factor: int | None = None,
):
    """verl's `ActorConfig` holding what its policy loss reads (clip range, aggregation, and
    seq-mean-token-sum-norm's constant divisor; None = each mini-batch's padded length)."""
    return ActorConfig(
        strategy="fsdp",
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        clip_ratio=clip_ratio,
        clip_ratio_low=clip_ratio,
        clip_ratio_high=clip_ratio_high or clip_ratio,
        loss_agg_mode=loss_agg_mode,
        loss_scale_factor=loss_scale_factor,
    )


def set_global_batch(config: ActorConfig, response_mask: torch.Tensor) -> None:
    """Normalise micro-batch losses by the whole mini-batch (`response_mask` (b, T) of it)."""
    config.global_batch_info.update(
        dp_size=1,
        batch_num_tokens=int(response_mask.sum()),
        global_batch_size=int((response_mask.sum(-1) > 0).sum()),
        loss_scale_factor=config.loss_scale_factor or response_mask.shape[-1],
    )


def aggregate(
    loss_mat: torch.Tensor,  # (B, T)
    response_mask: torch.Tensor,  # (B, T)
    config: ActorConfig,
) -> torch.Tensor:
    """verl's `agg_loss` of a per-token loss, normalised by the mini-batch (`set_global_batch`)."""
    return core_algos.agg_loss(
        loss_mat, response_mask, config.loss_agg_mode, **config.global_batch_info
    )


def policy_loss(
    log_prob: torch.Tensor,  # (B, T)
    old_log_prob: torch.Tensor,  # (B, T)
    advantages: torch.Tensor,  # (B, T)
    response_mask: torch.Tensor,  # (B, T)
    config: ActorConfig,
    rollout_is_weights: torch.Tensor | None = None,  # (B, T) detached, sparring.rollout_correction
) -> tuple[torch.Tensor, dict[str, float]]:
    """verl's clipped PPO loss ("vanilla" `compute_policy_loss`): (loss, clip/KL diagnostics).
    With `rollout_is_weights`, verl multiplies each token's loss by its weight."""
    loss_fn = core_algos.get_policy_loss_fn("vanilla")
    loss, metrics = loss_fn(
        old_log_prob=old_log_prob,
        log_prob=log_prob,
        advantages=advantages,
        response_mask=response_mask,
        loss_agg_mode=config.loss_agg_mode,
        config=config,
        rollout_is_weights=rollout_is_weights,
    )
    return loss, {k.removeprefix("actor/"): v for k, v in metrics.items()}


def kl_loss(
    log_prob: torch.Tensor,  # (B, T)
    ref_log_prob: torch.Tensor,  # (B, T)
    response_mask: torch.Tensor,  # (B, T)
    kl_type: str,
    config: ActorConfig,
    weights: torch.Tensor | None = None,  # (B, T) per-token loss weights (`state_weights`)
) -> tuple[torch.Tensor, torch.Tensor]:
    """KL(policy || reference) via verl's `kl_penalty` + `agg_loss`: (loss, masked mean KL,
    unweighted)."""
    kl = core_algos.kl_penalty(log_prob, ref_log_prob, kl_penalty=kl_type)  # (B, T)
    loss = aggregate(kl if weights is None else kl * weights, response_mask, config)
    mean = (kl * response_mask).sum() / response_mask.sum().clamp(min=1)
    return loss, mean.detach()


def transfer_loss(
    pooled: torch.Tensor,  # (B, H) each row's mean final hidden state over its prompt
    roles: Sequence[str],  # (B,) each row's role
    pairs: Sequence[tuple[str, str]],
) -> tuple[torch.Tensor, int]:
    """Seed 001's cross-role transfer loss: for each pair (a, b) with rows of both roles, the
    mean squared difference (over H) between the mean `pooled` row of a and that of b,
    averaged over those pairs; (0 in the graph, 0) when no pair has both. Returns
    (loss, how many pairs were present)."""
    labels = np.asarray(roles, dtype=object)
    means = {}  # role -> (H,) mean of its rows
    for role in {r for pair in pairs for r in pair}:
        rows = np.flatnonzero(labels == role)
        if len(rows):
            means[role] = pooled[torch.as_tensor(rows, device=pooled.device)].float().mean(0)
    gaps = [(means[a] - means[b]).pow(2).mean() for a, b in pairs if a in means and b in means]
    if not gaps:
        return pooled.float().sum() * 0.0, 0
    return torch.stack(gaps).mean(), len(gaps)


def advantage_stats(
    scores: np.ndarray, index: np.ndarray, advantages: np.ndarray, key: str
) -> dict[str, float]:
    """Diagnostics for group key `key`: group sizes, zero-variance share, advantage moments.

    `scores` (B,) are the summed rewards, `advantages` (B,) each row's sequence advantage.
    """
    df = pd.DataFrame({"g": index.astype(str), "r": scores, "a": advantages})
    groups = df.groupby("g")
    sizes, spread = groups.size(), groups.r.max() - groups.r.min()
    multi = sizes > 1
    zero_std = float((spread[multi] < TIE_TOLERANCE).mean()) if multi.any() else 1.0
    return {
        f"train/{key}/num_groups": float(len(sizes)),
        f"train/{key}/mean_group_size": float(sizes.mean()),
        f"train/{key}/singleton_groups": float((~multi).sum()),
        f"train/{key}/frac_reward_zero_std": zero_std,
        f"train/{key}/adv_mean": float(df.a.mean()),
        f"train/{key}/adv_std": float(df.a.std(ddof=0)),
        f"train/{key}/adv_abs_max": float(df.a.abs().max()),
    }
