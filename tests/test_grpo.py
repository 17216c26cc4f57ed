"""GRPO math against hand-computed values (arithmetic in the comments).

verl's `compute_grpo_outcome_advantage` uses the unbiased std (n - 1) and adds eps = 1e-6.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
from verl.trainer.ppo import core_algos

from sparring import grpo
from sparring.train_config import LOSS_AGG_MODES

SCORES = [1.0, 0.0, 1.0, 1.0, 0.5, 0.2]
FRAME = pd.DataFrame(
    {
        "game": ["g0", "g0", "g1", "g1", "g2", "g3"],
        "init": ["s0", "s0", "s0", "s1", "s1", "s1"],
        "role": ["p", "r", "p", "r", "p", "r"],
        "country": ["FR", "FR", "DE", "DE", "DE", "IT"],
    }
)


def advantages(key: str, norm: bool = True, singleton: str = "zero") -> list[float]:
    """Sequence advantage per row: rewards on the last of 3 tokens, the middle one masked."""
    token_rewards = torch.zeros(6, 3)
    token_rewards[:, 2] = torch.tensor(SCORES)
    mask = torch.tensor([[1.0, 0.0, 1.0]] * 6)
    adv = grpo.grpo_advantages(token_rewards, mask, grpo.group_index(FRAME, key), norm, singleton)
    assert (adv[:, 1] == 0).all() and torch.equal(adv[:, 0], adv[:, 2])  # masked, constant
    return adv[:, 0].tolist()


def test_game_key_pairs_seats_and_zeroes_singletons():
    # g0 = [1, 0]: mean .5, std = sqrt((.25 + .25) / 1) = .7071 -> +-.5 / .7071 = +-.7071
    # g1 = [1, 1]: std 0 -> 0 / (0 + 1e-6) = 0;  g2, g3 are singletons -> 0 (policy "zero")
    assert advantages("game") == pytest.approx([0.7071, -0.7071, 0, 0, 0, 0], abs=1e-3)


def test_verl_gives_singletons_their_raw_score():
    # The behaviour our policy overrides: mean 0, std 1 -> advantage = score (.5 and .2).
    token_rewards = torch.tensor([[0.5], [0.2]])
    adv, _ = grpo.core_algos.compute_grpo_outcome_advantage(
        token_rewards, torch.ones(2, 1), np.array(["a", "b"], dtype=object)
    )
    assert adv[:, 0].tolist() == pytest.approx([0.5, 0.2], abs=1e-5)


def test_init_key_without_std_is_dr_grpo():
    # s0 = [1, 0, 1]: mean 2/3 -> [1/3, -2/3, 1/3];  s1 = [1, .5, .2]: mean 1.7/3 = .5667
    # -> [.4333, -.0667, -.3667]
    expected = [1 / 3, -2 / 3, 1 / 3, 0.4333, -0.0667, -0.3667]
    assert advantages("init", norm=False) == pytest.approx(expected, abs=1e-3)


def test_role_key():
    # p = [1, 1, .5]: mean .8333, deviations [.1667, .1667, -.3333], squares sum .1667,
    #   std = sqrt(.1667 / 2) = .2887 -> [.5774, .5774, -1.1547]
    # r = [0, 1, .2]: mean .4, deviations [-.4, .6, -.2], squares sum .56,
    #   std = sqrt(.56 / 2) = .5292 -> [-.7559, 1.1339, -.3780]
    expected = [0.5774, -0.7559, 0.5774, 1.1339, -1.1547, -0.3780]
    assert advantages("role") == pytest.approx(expected, abs=1e-3)


def test_batch_key():
    # all six: mean 3.7 / 6 = .6167; deviations [.3833, -.6167, .3833, .3833, -.1167, -.4167],
    # squares sum 1.0083, std = sqrt(1.0083 / 5) = .4491 -> deviation / .4491
    expected = [0.8536, -1.3732, 0.8536, 0.8536, -0.2598, -0.9278]
    assert advantages("batch") == pytest.approx(expected, abs=1e-3)


def test_any_column_and_singleton_policies():
    # FR = [1, 0] -> +-.7071;  DE = [1, 1, .5] -> [.5774, .5774, -1.1547] (as role p above)
    # IT = [.2] is a singleton: "zero" -> 0; "batch" -> its batch advantage, -.9278 (above)
    grouped = [0.7071, -0.7071, 0.5774, 0.5774, -1.1547]
    assert advantages("country") == pytest.approx([*grouped, 0.0], abs=1e-3)
    assert advantages("country", singleton="batch") == pytest.approx([*grouped, -0.9278], abs=1e-3)


def test_a_batch_of_one_gets_zero_under_either_policy():
    for policy in grpo.SINGLETON_POLICIES:
        adv = grpo.grpo_advantages(
            torch.tensor([[0.7]]), torch.ones(1, 1), np.array(["x"], dtype=object), True, policy
        )
        assert adv.item() == 0.0


def test_bad_group_key_and_policy_fail_clearly():
    with pytest.raises(ValueError, match="not a samples column.*'batch'"):
        grpo.group_index(FRAME, "phase")
    with pytest.raises(ValueError, match="unknown singleton policy"):
        grpo.grpo_advantages(torch.zeros(1, 1), torch.ones(1, 1), np.array(["a"]), True, "raw")


def test_policy_loss_clips_by_hand():
    # old = 0, new = log 1.5 -> ratio 1.5 on both tokens; clip_ratio .2 -> clipped ratio 1.2.
    # A = +1: max(-1.5, -1.2) = -1.2 (clipped);  A = -1: max(1.5, 1.2) = 1.5, min(3, 1.5) = 1.5
    # token-mean: (-1.2 + 1.5) / 2 = .15; clip fraction 1/2; ppo_kl = mean(old - new) = -.4055
    config = grpo.actor_config(0.2, None, "token-mean")
    log_prob = torch.full((1, 2), math.log(1.5))
    loss, diag = grpo.policy_loss(
        log_prob, torch.zeros(1, 2), torch.tensor([[1.0, -1.0]]), torch.ones(1, 2), config
    )
    assert loss.item() == pytest.approx(0.15, abs=1e-5)
    assert diag["pg_clipfrac"] == pytest.approx(0.5)
    assert diag["ppo_kl"] == pytest.approx(-math.log(1.5), abs=1e-5)


def test_kl_penalty_by_hand():
    # low_var_kl with log p = 0, log ref = log 2: r = ref/p = 2 -> r - log r - 1 = 1 - .6931
    config = grpo.actor_config(0.2, None, "token-mean")
    loss, mean = grpo.kl_loss(
        torch.zeros(1, 1), torch.full((1, 1), math.log(2)), torch.ones(1, 1), "low_var_kl", config
    )
    assert loss.item() == pytest.approx(1 - math.log(2), abs=1e-5) and mean == loss


def test_a_weighted_kl_scales_each_tokens_term():
    # the same KL as above on two tokens, weighted 3 and 1: token-mean (3 + 1) / 2 = 2 times it
    config = grpo.actor_config(0.2, None, "token-mean")
    loss, mean = grpo.kl_loss(
        torch.zeros(1, 2),
        torch.full((1, 2), math.log(2)),
        torch.ones(1, 2),
        "low_var_kl",
        config,
        torch.tensor([[3.0, 1.0]]),
    )
    assert loss.item() == pytest.approx(2 * (1 - math.log(2)), abs=1e-5)
    assert mean.item() == pytest.approx(1 - math.log(2), abs=1e-5)  # the KL itself, unweighted


def test_state_weights_by_hand():
    # Token ids with the seat's own replies marked. Rows 0 and 1 first reply after the same
    # prefix [5, 6] (state A, 2 visits); row 1 replies again after [5, 6, 7, 7, 8] (B, 1 visit);
    # row 2 replies after [5, 9] (C, 1 visit); row 0's padding (0) is no part of a prefix.
    ids = torch.tensor([[5, 6, 7, 7, 0, 0], [5, 6, 7, 7, 8, 7], [5, 9, 7, 0, 0, 0]])
    mask = torch.tensor([[0, 0, 1, 1, 0, 0], [0, 0, 1, 1, 0, 1], [0, 0, 1, 0, 0, 0]]).float()
    response = mask[:, 1:]  # (B, T-1): position t scores token t+1

    def by_token(a: float, b: float) -> torch.Tensor:  # A's replies weigh a, B's and C's b
        return torch.tensor(
            [[0, 0, a, a, 0, 0], [0, 0, a, a, 0, b], [0, 0, b, 0, 0, 0]], dtype=torch.float32
        )[:, 1:]

    # balance 1: raw 1/2, 1/2, 1, 1 (replies A, A, B, C), mean 3/4 -> 2/3 and 4/3; each
    # state's total is then 4/3: the rare states weigh as much as the common one
    weights, metrics = grpo.state_weights(ids, response, 1.0)
    torch.testing.assert_close(weights, by_token(2 / 3, 4 / 3))
    assert metrics == {
        "train/decision_states": 3.0,
        "train/state_visits_min": 1.0,
        "train/state_weight_max": pytest.approx(4 / 3),
    }
    # balance 1/2: raw 2 ** -1/2 (twice), 1, 1, mean (2 ** 1/2 + 2) / 4
    mean = (2**0.5 + 2) / 4
    weights, _ = grpo.state_weights(ids, response, 0.5)
    torch.testing.assert_close(weights, by_token(2**-0.5 / mean, 1 / mean))
    torch.testing.assert_close(grpo.state_weights(ids, response, 0.0)[0], response)  # plain


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_micro_batch_losses_add_up_to_the_mini_batch_loss(mode):
    gen = torch.Generator().manual_seed(0)
    log_prob, old = torch.randn(4, 5, generator=gen), torch.randn(4, 5, generator=gen)
    adv = torch.randn(4, 5, generator=gen)
    mask = (torch.rand(4, 5, generator=gen) > 0.3).float()
    whole = grpo.actor_config(0.2, None, mode)
    grpo.set_global_batch(whole, mask)
    full, _ = grpo.policy_loss(log_prob, old, adv, mask, whole)
    parts = [
        grpo.policy_loss(log_prob[r], old[r], adv[r], mask[r], whole)[0]
        for r in (slice(0, 1), slice(1, 4))
    ]
    assert sum(parts).item() == pytest.approx(full.item(), abs=1e-5)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_masked_tokens_get_no_gradient(mode):
    """Perturbing a masked token's logits leaves the policy + KL loss unchanged."""
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 4, 7, generator=gen, requires_grad=True)  # (B, T, V)
    tokens = torch.randint(0, 7, (2, 4), generator=gen)
    mask = torch.tensor([[1.0, 0.0, 1.0, 0.0], [0.0, 1.0, 1.0, 1.0]])
    old, ref = torch.randn(2, 4, generator=gen), torch.randn(2, 4, generator=gen)
    adv = torch.randn(2, 4, generator=gen)
    config = grpo.actor_config(0.2, None, mode)
    grpo.set_global_batch(config, mask)

    def loss_of(logits):
        log_prob = torch.log_softmax(logits, -1).gather(-1, tokens[..., None])[..., 0]
        pg, _ = grpo.policy_loss(log_prob, old, adv, mask, config)
        kl, _ = grpo.kl_loss(log_prob, ref, mask, "low_var_kl", config)
        return pg + 0.1 * kl

    loss = loss_of(logits)
    loss.backward()
    assert (logits.grad[mask == 0] == 0).all() and (logits.grad[mask == 1] != 0).any()
    bumped = logits.detach().clone()
    bumped[0, 1] += 5.0  # a masked position
    bumped[1, 0] -= 3.0  # another
    assert loss_of(bumped).item() == pytest.approx(loss.item(), abs=1e-6)


def test_advantage_stats_count_zero_variance_groups():
    index = np.array(["a", "a", "b", "b", "c"], dtype=object)
    stats = grpo.advantage_stats(np.array([1, 1, 0, 1, 0.5]), index, np.zeros(5), "game")
    assert stats["train/game/frac_reward_zero_std"] == 0.5  # a ties, b doesn't; c is alone
    assert stats["train/game/singleton_groups"] == 1 and stats["train/game/num_groups"] == 3
    assert stats["train/game/mean_group_size"] == pytest.approx(5 / 3)


def test_a_tied_group_gets_exactly_zero_where_verl_leaves_rounding_noise():
    """16 plays of one state, each rewarded 0.7: verl's float32 mean and std leave +0.056."""
    token_rewards = torch.zeros(16, 2)
    token_rewards[:, 1] = 0.7
    mask, index = torch.ones(16, 2), np.array(["s"] * 16, dtype=object)
    raw, _ = core_algos.compute_grpo_outcome_advantage(
        token_level_rewards=token_rewards, response_mask=mask, index=index
    )
    assert raw.abs().min() > 0.05  # the artefact
    assert torch.equal(grpo.grpo_advantages(token_rewards, mask, index), torch.zeros(16, 2))


def test_beside_a_tied_group_a_varied_one_keeps_verls_advantages():
    # group t: 0.7, 0.7, 0.7 (tied) -> 0; group v: 1.0, 0.0 -> mean 0.5, unbiased std
    # sqrt(0.5) = 0.7071, so +-0.5 / 0.7071 = +-0.7071
    token_rewards = torch.tensor([[0.0, 0.7]] * 3 + [[0.0, 1.0], [0.0, 0.0]])
    index = np.array(["t", "t", "t", "v", "v"], dtype=object)
    adv = grpo.grpo_advantages(token_rewards, torch.ones(5, 2), index)
    assert adv[:3].abs().max() == 0
    assert adv[3:, 0].tolist() == pytest.approx([0.7071, -0.7071], abs=1e-4)


def test_under_the_batch_policy_a_singleton_is_tied_only_if_the_whole_batch_is():
    token_rewards = torch.tensor([[0.7], [0.7], [0.7]])
    tied_batch = grpo.grpo_advantages(
        token_rewards, torch.ones(3, 1), np.array(["a", "a", "b"], dtype=object), True, "batch"
    )
    assert torch.equal(tied_batch, torch.zeros(3, 1))
    varied = grpo.grpo_advantages(
        torch.tensor([[0.7], [0.7], [1.0]]),
        torch.ones(3, 1),
        np.array(["a", "a", "b"], dtype=object),
        True,
        "batch",
    )
    assert varied[:2].abs().max() == 0 and varied[2, 0] > 0  # b compared with the batch


def test_init_seat_gives_each_seat_of_a_state_its_own_baseline():
    # One state, two plays, zero-sum: seat 0 wins both (1, 1), seat 1 loses both (0, 0).
    # `init` puts all four in one group (mean 0.5, unbiased std 0.5774): +-0.866, blaming seat
    # 1 for its seat; `init_seat` compares each seat with itself: both groups tie, so 0.
    rows = pd.DataFrame({"init": ["s"] * 4, "seat": [0, 0, 1, 1]})
    rows["init_seat"] = rows.init + "/" + rows.seat.astype(str)
    token_rewards = torch.tensor([[1.0], [1.0], [0.0], [0.0]])
    by_init = grpo.grpo_advantages(token_rewards, torch.ones(4, 1), grpo.group_index(rows, "init"))
    assert by_init[:, 0].tolist() == pytest.approx([0.866, 0.866, -0.866, -0.866], abs=1e-3)
    index = grpo.group_index(rows, "init_seat")
    assert grpo.grpo_advantages(token_rewards, torch.ones(4, 1), index).abs().max() == 0


def test_dr_grpos_divisor_is_a_constant_not_the_mini_batchs_padded_length():
    """The same two rows padded to 5 or to 9 tokens: with a constant divisor the loss is the
    same; with verl's default (the padded length) the longer padding shrinks it 5/9."""
    rows = torch.tensor([[1.0, 2.0, 3.0, 0.0, 0.0], [4.0, 5.0, 0.0, 0.0, 0.0]])
    mask = (rows > 0).float()
    padded, padded_mask = (
        torch.nn.functional.pad(rows, (0, 4)),
        torch.nn.functional.pad(mask, (0, 4)),
    )

    def loss(values, m, factor):
        config = grpo.actor_config(0.2, None, "seq-mean-token-sum-norm", factor)
        grpo.set_global_batch(config, m)
        return grpo.aggregate(values, m, config).item()

    assert loss(rows, mask, 64) == pytest.approx(loss(padded, padded_mask, 64))
    assert loss(padded, padded_mask, None) == pytest.approx(loss(rows, mask, None) * 5 / 9)
    assert loss(rows, mask, 64) == pytest.approx((6 + 9) / 2 / 64)  # mean of token sums / 64
