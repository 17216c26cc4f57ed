"""The rollout engine's log-probs against the trainer's: the mismatch, and verl's corrections.

The engine samples with its own kernels (a KV cache, left padding, bf16 or SGLang on a GPU);
the trainer recomputes the same tokens' log-probs with its own forward. Like verl, prime-rl,
slime and OpenRLHF, Sparring keeps the engine's log-probs (the samples' `rollout_log_probs`)
to measure the gap and, if asked, correct for it. With r = old_log_prob - rollout_log_prob per
response token (old = the trainer's log-probs under the weights that played):

    mismatch_kl        k3 estimator of KL(pi_rollout || pi_old): the mean over response tokens
                       of exp(r) - r - 1 (verl's `rollout_corr/k3_kl`); >= 0, 0 iff they agree
    mismatch_frac_out  the share of response tokens whose ratio exp(r) leaves [0.5, 2]
    rollout_is         truncated importance sampling (TIS): each token's policy loss times
                       min(exp(r), rollout_is_threshold), detached; "sequence" uses the
                       sequence's product of ratios instead. verl's own
                       `compute_rollout_correction_weights` computes the weights.
    bypass_mode        old = rollout: PPO's ratio becomes pi_theta / pi_rollout and its clip
                       bounds the correction; the trainer's recompute pass is skipped (verl's
                       bypass mode with loss_type ppo_clip).

All tensors are the trainer's (B, T) response tensors: position t scores token t+1.
"""

from __future__ import annotations

import torch
from verl.trainer.ppo import rollout_corr_helper

SAFETY_BOUND = rollout_corr_helper.SAFETY_BOUND  # |r| is clamped to 20 before exp, as in verl
MISMATCH_RANGE = (0.5, 2.0)  # ratios outside count in `mismatch_frac_out`


def mismatch_metrics(
    old_log_prob: torch.Tensor,  # (B, T) the trainer's, at the weights that played
    rollout_log_prob: torch.Tensor,  # (B, T) the engine's
    response_mask: torch.Tensor,  # (B, T)
) -> dict[str, float]:
    """`mismatch_kl` (k3) and `mismatch_frac_out` over the response tokens (named without the
    `train/` prefix); empty when there are no response tokens."""
    mask = response_mask.bool()
    if not mask.any():
        return {}
    r = (old_log_prob.double() - rollout_log_prob.double())[mask]  # (N,)
    r = r.clamp(-SAFETY_BOUND, SAFETY_BOUND)
    ratio = r.exp()  # (N,)
    low, high = MISMATCH_RANGE
    return {
        "mismatch_kl": float((ratio - r - 1).mean()),
        "mismatch_frac_out": float(((ratio < low) | (ratio > high)).double().mean()),
    }


def is_weights(
    old_log_prob: torch.Tensor,  # (B, T)
    rollout_log_prob: torch.Tensor,  # (B, T)
    response_mask: torch.Tensor,  # (B, T)
    level: str,
    threshold: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Truncated importance weights (B, T), detached and 0 off the mask, from verl's
    `compute_rollout_correction_weights` (`level` token or sequence, cap `threshold`), with
    its mean weight (`rollout_is_mean`, over tokens) and the share of tokens (sequences, at
    sequence level) whose ratio exceeded the cap (`rollout_is_capped`)."""
    if not response_mask.any():  # verl's metrics need a token; nothing to weight anyway
        return torch.zeros_like(response_mask, dtype=torch.float32), {}
    weights, stats = rollout_corr_helper.compute_rollout_correction_weights(
        log_ratio=(old_log_prob - rollout_log_prob).float(),
        response_mask=response_mask,
        rollout_is=level,
        rollout_is_threshold=float(threshold),
    )  # (B, T)
    return weights, {
        "rollout_is_mean": float(stats["rollout_is_mean"]),
        "rollout_is_capped": float(stats["rollout_is_ratio_fraction_high"]),
    }
