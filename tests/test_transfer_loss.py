"""The cross-role transfer loss (seed 001's cross-country transfer): its arithmetic on
hand-made hidden states, its gradient, its config checks, and weight 0 leaving the update as
it was."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError
from sample_frames import make_samples
from transformers import AutoTokenizer

from sparring.grpo import transfer_loss
from sparring.train import (
    GRPOConfig,
    advantages_for,
    collate,
    grpo_update,
    load_model,
    prompt_scores,
    token_log_probs,
)

CPU = torch.device("cpu")
PAIRS = [("AUSTRIA", "ITALY"), ("ENGLAND", "RUSSIA"), ("FRANCE", "GERMANY")]
# Five rows, H = 2. AUSTRIA's mean is (2, 2), ITALY's (0, 0): a squared gap of 4 + 4 over two
# dimensions = 4. FRANCE (1, 0) against GERMANY (0, 2): (1 + 4) / 2 = 2.5. ENGLAND has no
# RUSSIA, so its pair is absent. Loss = mean(4, 2.5) = 3.25 over 2 present pairs.
ROLES = ["AUSTRIA", "AUSTRIA", "ITALY", "FRANCE", "GERMANY", "ENGLAND"]
POOLED = [[1.0, 3.0], [3.0, 1.0], [0.0, 0.0], [1.0, 0.0], [0.0, 2.0], [5.0, 5.0]]


def test_hand_made_hidden_states():
    loss, present = transfer_loss(torch.tensor(POOLED), ROLES, PAIRS)
    assert present == 2
    torch.testing.assert_close(loss, torch.tensor(3.25))


def test_absent_pairs_contribute_nothing():
    pooled = torch.tensor(POOLED, requires_grad=True)
    # only ENGLAND and AUSTRIA: no pair has both roles
    loss, present = transfer_loss(pooled[[0, 5]], ["AUSTRIA", "ENGLAND"], PAIRS)
    assert present == 0 and loss.item() == 0.0
    loss.backward()  # still in the graph: a micro-batch without pairs backpropagates zeros
    assert pooled.grad.abs().sum() == 0
    # the pair that is present alone gives its own gap: AUSTRIA (2, 2) vs ITALY (0, 0) = 4
    loss, present = transfer_loss(torch.tensor(POOLED[:3]), ROLES[:3], PAIRS)
    assert present == 1 and loss.item() == 4.0


def test_gradient_pulls_the_pairs_means_together():
    pooled = torch.tensor(POOLED, requires_grad=True)
    loss, _ = transfer_loss(pooled, ROLES, PAIRS)
    loss.backward()
    # d/d(AUSTRIA mean) of mean((m_A - m_I)^2) = 2 (m_A - m_I) / H = (2, 2), split over its 2
    # rows (1, 1) and halved by the mean over 2 present pairs: (.5, .5) on each AUSTRIA row;
    # ITALY's single row gets -(2, 2) / 2 = (-1, -1). ENGLAND's row, unpaired, gets nothing.
    torch.testing.assert_close(pooled.grad[0], torch.tensor([0.5, 0.5]))
    torch.testing.assert_close(pooled.grad[2], torch.tensor([-1.0, -1.0]))
    assert pooled.grad[5].abs().sum() == 0
    with torch.no_grad():  # a gradient step shrinks both gaps
        stepped = pooled - 0.5 * pooled.grad
    after, _ = transfer_loss(stepped, ROLES, PAIRS)
    assert after < loss


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def test_a_model_trained_on_the_loss_alone_brings_the_prompts_closer(tiny_model_dir, tokenizer):
    """Through the real forward: SGD on the transfer loss of the prompts' mean final hidden
    states (`prompt_scores`) shrinks the distance between the two roles' means."""
    df = make_samples(tokenizer, [1.0, 0.0, 0.5, 0.5])  # roles proposer, reviewer, ...
    batch, pairs = collate(df, tokenizer.pad_token_id), [("proposer", "reviewer")]
    model = load_model(tiny_model_dir, CPU)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    distances = []
    for _ in range(3):
        _, _, pooled = prompt_scores(model, batch)  # (4, H)
        loss, present = transfer_loss(pooled, df.role.tolist(), pairs)
        assert present == 1
        opt.zero_grad()
        loss.backward()
        opt.step()
        distances.append(loss.item())
    assert distances[-1] < distances[0]


def test_pooling_reuses_the_forward_and_leaves_the_log_probs_as_they_are(tiny_model_dir, tokenizer):
    df = make_samples(tokenizer, [1.0, 0.0, 0.5, 0.5])
    batch = collate(df, tokenizer.pad_token_id)
    model = load_model(tiny_model_dir, CPU)
    with torch.no_grad():
        plain, plain_entropy = token_log_probs(model, batch, True)
        log_prob, entropy, pooled = prompt_scores(model, batch)
        hidden = model.get_decoder()(
            input_ids=batch.input_ids, attention_mask=batch.attention_mask
        ).last_hidden_state  # (B, T, H)
    assert torch.equal(plain, log_prob) and torch.equal(plain_entropy, entropy)
    # row 0's prompt: attended tokens outside its own replies (token 0 is never a reply)
    own = torch.cat([torch.zeros(1), batch.response_mask[0]]).bool()
    prompt = batch.attention_mask[0].bool() & ~own
    torch.testing.assert_close(pooled[0], hidden[0][prompt].mean(0))


def update(tiny_model_dir, df, batch, cfg: GRPOConfig, roles=None) -> torch.Tensor:
    """The weights after one `grpo_update` of the tiny model, flattened."""
    model = load_model(tiny_model_dir, CPU)
    metrics = grpo_update(model, batch, advantages_for(df, batch, cfg)[0], cfg, CPU, roles=roles)
    return torch.cat([p.detach().flatten() for p in model.parameters()]), metrics


def test_weight_zero_is_the_plain_update_bit_for_bit(tiny_model_dir, tokenizer):
    df = make_samples(tokenizer, [1.0, 0.0, 0.3, 0.6])
    batch, roles = collate(df, tokenizer.pad_token_id), df.role.tolist()
    base = {"group_key": "batch", "lr": 1e-3, "mini_batch_size": 4, "micro_batch_size": 2}
    plain, plain_metrics = update(tiny_model_dir, df, batch, GRPOConfig(**base))
    pairs = [("proposer", "reviewer")]
    off = GRPOConfig(**base, transfer_weight=0.0, transfer_pairs=pairs)
    zero, zero_metrics = update(tiny_model_dir, df, batch, off, roles)
    assert torch.equal(plain, zero)
    assert not any(k.startswith("train/transfer") for k in zero_metrics)
    on = GRPOConfig(**base, transfer_weight=1.0, transfer_pairs=pairs)
    moved, metrics = update(tiny_model_dir, df, batch, on, roles)
    assert not torch.equal(plain, moved)  # the option is live when its weight is not 0
    assert metrics["train/transfer_loss"] > 0 and metrics["train/transfer_pairs"] == 1
    assert 0 < metrics["train/transfer_share"] < 1


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"transfer_weight": -0.1}, "greater than or equal to 0"),
        ({"transfer_weight": 0.1}, "needs transfer_pairs"),
        ({"transfer_weight": 0.1, "transfer_pairs": [("a", "a")]}, "pairs a role with itself"),
    ],
)
def test_bad_transfer_settings_fail_clearly(fields, message):
    with pytest.raises(ValidationError, match=message):
        GRPOConfig(**fields)


def test_the_trainer_refuses_pairs_that_name_no_role_of_the_samples(
    tiny_model_dir, tokenizer, tmp_path
):
    from sparring.train import train

    path = tmp_path / "samples.parquet"
    make_samples(tokenizer, [1.0, 0.0, 0.3, 0.6]).to_parquet(path, index=False)
    cfg = GRPOConfig(group_key="batch", transfer_weight=0.1, transfer_pairs=[("Austria", "x")])
    with pytest.raises(ValueError, match=r"name no role of these samples \(\['proposer'"):
        train(tiny_model_dir, [str(path)], tmp_path / "out", cfg)


def test_a_recipe_checks_the_pairs_against_the_games_roles():
    from sparring.loop.config import PipelineConfig

    def recipe(**train):
        return PipelineConfig.model_validate({"train": train})  # the matching game

    with pytest.raises(ValidationError, match="has no default transfer_pairs"):
        recipe(transfer_weight=0.1)
    with pytest.raises(ValidationError, match=r"names \['seller'\], not roles of matching"):
        recipe(transfer_weight=0.1, transfer_pairs=[["seller", "player_a"]])
    cfg = recipe(transfer_weight=0.1, transfer_pairs=[["player_a", "player_b"]])
    assert cfg.train.transfer_pairs == [("player_a", "player_b")]
    assert recipe().train.transfer_pairs is None  # off: nothing filled in
    with pytest.raises(ValidationError, match="set train_backend: torch or transfer_weight: 0"):
        PipelineConfig.model_validate(
            {
                "train": {"transfer_weight": 0.1, "transfer_pairs": [["player_a", "player_b"]]},
                "train_backend": "verl",
                "device": "cuda",
            }  # fmt: skip
        )
