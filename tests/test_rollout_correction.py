"""The rollout-trainer mismatch and verl's truncated importance sampling on hand-made tensors,
checked against verl's own functions on the same tensors."""

from __future__ import annotations

import math

import pytest
import torch
from verl.trainer.ppo import rollout_corr_helper

from sparring import grpo
from sparring.rollout_correction import is_weights, mismatch_metrics

# One row, four positions; the last is off the mask (its ratio, e^5, must not count).
# r = old - rollout = ln 3, ln 0.6, ln 0.25, 5  ->  ratios 3, 0.6, 0.25
R = torch.tensor([[math.log(3), math.log(0.6), math.log(0.25), 5.0]])
ROLLOUT = torch.tensor([[-1.0, -2.0, -0.5, -3.0]])
OLD = ROLLOUT + R
MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0]])


def test_mismatch_is_the_k3_kl_and_the_share_of_ratios_outside_half_to_two():
    # k3 = ratio - r - 1:  3 - ln 3 - 1 = 0.901388,  0.6 - ln 0.6 - 1 = 0.110826,
    #                      0.25 - ln 0.25 - 1 = 0.636294;  mean = 1.648508 / 3 = 0.549503
    # outside [0.5, 2]: 3 and 0.25, 2 of 3
    got = mismatch_metrics(OLD, ROLLOUT, MASK)
    assert got["mismatch_kl"] == pytest.approx(0.549503, abs=1e-6)
    assert got["mismatch_frac_out"] == pytest.approx(2 / 3)
    # verl's own off-policy metrics and TIS counters on the same tensors
    verl = rollout_corr_helper.compute_offpolicy_metrics(OLD, ROLLOUT, MASK)
    assert got["mismatch_kl"] == pytest.approx(verl["k3_kl"], abs=1e-6)
    _, counts = rollout_corr_helper.compute_rollout_correction_weights(OLD - ROLLOUT, MASK)
    out = counts["rollout_is_ratio_fraction_high"] + counts["rollout_is_ratio_fraction_low"]
    assert got["mismatch_frac_out"] == pytest.approx(out)
    # agreement is exactly 0; no response tokens, no metrics
    assert mismatch_metrics(ROLLOUT, ROLLOUT, MASK) == {"mismatch_kl": 0, "mismatch_frac_out": 0}
    assert mismatch_metrics(OLD, ROLLOUT, torch.zeros_like(MASK)) == {}


def test_truncated_importance_weights():
    # token: min(ratio, 2) = 2, 0.6, 0.25, and 0 off the mask; mean (2 + .6 + .25) / 3
    weights, stats = is_weights(OLD, ROLLOUT, MASK, "token", 2.0)
    torch.testing.assert_close(weights, torch.tensor([[2.0, 0.6, 0.25, 0.0]]))
    assert stats == pytest.approx({"rollout_is_mean": 2.85 / 3, "rollout_is_capped": 1 / 3})
    assert not weights.requires_grad
    # sequence: the product of ratios 3 * 0.6 * 0.25 = 0.45 on every token of the row
    weights, _ = is_weights(OLD, ROLLOUT, MASK, "sequence", 2.0)
    torch.testing.assert_close(weights, torch.tensor([[0.45, 0.45, 0.45, 0.0]]))
    # the same as verl's function on the same tensors, cap included
    want, _ = rollout_corr_helper.compute_rollout_correction_weights(
        OLD - ROLLOUT, MASK, rollout_is="token", rollout_is_threshold=1.5
    )
    torch.testing.assert_close(is_weights(OLD, ROLLOUT, MASK, "token", 1.5)[0], want)


def test_weights_multiply_each_tokens_policy_loss():
    # log_prob = old: ratio 1, no clipping, so each token's loss is -A = -1; weighted by
    # (2, 0.6, 0.25) and token-averaged over the 3 tokens: -(2 + 0.6 + 0.25) / 3 = -0.95
    cfg = grpo.actor_config(0.2, None, "token-mean")
    grpo.set_global_batch(cfg, MASK)
    weights, _ = is_weights(OLD, ROLLOUT, MASK, "token", 2.0)
    loss, _ = grpo.policy_loss(OLD, OLD, torch.ones_like(MASK), MASK, cfg, weights)
    assert loss.item() == pytest.approx(-0.95, abs=1e-6)
    plain, _ = grpo.policy_loss(OLD, OLD, torch.ones_like(MASK), MASK, cfg)
    assert plain.item() == pytest.approx(-1.0, abs=1e-6)
