"""A short self-play rollout with the real SmolLM2-135M-Instruct (2 games, 8-token replies),
and its rollout log-probs against the trainer's."""

from __future__ import annotations

import pandas as pd
import pytest
import torch
from sample_frames import mask_spans

from sparring.game_init import GameInitConfig, write_inits
from sparring.generation.base import SamplingParams
from sparring.models import resolve_model
from sparring.rollout import RolloutConfig, build_policies, load_inits, play, write_outputs
from sparring.samples import read_samples
from sparring.train import GRPOConfig, batched_log_probs, collate, load_model

CPU = torch.device("cpu")
GAME = {"k": 3, "max_turns": 2, "max_retries": 0}  # one try per turn: 2 generate calls


@pytest.fixture(scope="module")
def rollout(smollm2_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("smollm2-rollout")
    inits = load_inits(
        write_inits(GameInitConfig(game={"params": GAME}, num_train=1), out)["train"]
    )
    # the named model resolves to the session's converted checkpoint, offline
    model = resolve_model("smollm2-135m-instruct", smollm2_dir.parents[1])
    sampling = SamplingParams(temperature=0.7, max_new_tokens=8, seed=0)
    cfg = RolloutConfig(game={"params": GAME}, games_per_init=2, sampling=sampling)
    policies = build_policies(cfg.game, model, None, device="cpu")
    result = play(inits, policies, cfg, progress=False)
    return result, policies["policy"], write_outputs(result, out / "rollout")


def test_smollm2_rollout_writes_valid_samples(rollout):
    result, _, paths = rollout
    assert len(result.episodes) == 2 and result.generate_calls == 2
    df = read_samples(paths["samples"])  # checks the training columns
    assert len(df) == 4 and set(df.seat) == {0, 1}
    for row in df.itertuples():
        assert len(row.input_ids) == len(row.assistant_mask) == len(row.token_rewards)
        assert max(row.input_ids) < 49152 and row.prompt[0]["role"] == "system"
        assert sum(row.token_rewards) == pytest.approx(row.reward)


def test_assistant_masks_cover_exactly_the_generated_tokens(rollout):
    result, backend, _ = rollout
    tok = backend.tokenizer
    masked = 0
    for row in result.samples:
        spans = mask_spans(row["assistant_mask"])
        replies = [m["content"] for m in row["messages"] if m["role"] == "assistant"]
        decoded = [tok.decode(row["input_ids"][a:b], skip_special_tokens=True) for a, b in spans]
        assert decoded == replies
        for a, b in spans:  # a reply ends with its stop token (<|im_end|>, or another special
            # token, kept: sparring.generation.stops) or is cut at max_new_tokens
            assert row["input_ids"][b - 1] in backend.stop_ids or b - a == 8
        masked += sum(row["assistant_mask"])
        # everything outside the replies is SmolLM2's own chat template, token for token
        blanked = [{**m, "content": ""} if m["role"] == "assistant" else m for m in row["messages"]]
        text = tok.apply_chat_template(blanked, tokenize=False)
        ids, mask = row["input_ids"], row["assistant_mask"]
        kept = [t for t, m in zip(ids, mask, strict=True) if not m or t == tok.eos_token_id]
        # a sample ends at its last reply token: "\n" (or a cut reply's <|im_end|>) follows
        closing = "\n" if ids[-1] == tok.eos_token_id else "<|im_end|>\n"
        assert text == tok.decode(kept) + closing
    assert masked == backend.generated_tokens  # every generated token, and nothing else


def test_samples_frame_round_trips(rollout):
    _, _, paths = rollout
    df = pd.read_parquet(paths["samples"])
    assert df.policy.eq("policy").all() and df.normalized_reward.between(0, 1).all()


def test_rollout_log_probs_are_the_trainers_at_the_sampling_temperature(rollout, smollm2_dir):
    """The engine's log-probs of its T=0.7 tokens (KV cache, left padding, packed weights) are
    the trainer's recomputed T=0.7 log-probs to 1e-3 (measured: max |diff| ~2e-5), and clearly
    not the T=1 ones (measured: mean |diff| 0.32 nats)."""
    _, backend, paths = rollout
    df = read_samples(paths["samples"])
    assert df.rollout_log_probs.notna().all() and (df.temperature == 0.7).all()
    model = load_model(resolve_model("smollm2-135m-instruct", smollm2_dir.parents[1]), CPU)
    gaps = {}
    for temperature, rows in [(0.7, [0, 1]), (1.0, [0])]:  # one game's two seats (CPU time)
        batch = collate(
            df.iloc[rows].assign(temperature=temperature), backend.tokenizer.pad_token_id
        )
        old = batched_log_probs(model, batch, range(len(rows)), GRPOConfig(), CPU)  # (B, T-1)
        gaps[temperature] = (old - batch.rollout_log_prob)[batch.response_mask.bool()].abs()
    assert gaps[0.7].max() < 1e-3
    assert gaps[1.0].mean() > 0.05
