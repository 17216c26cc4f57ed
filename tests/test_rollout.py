"""The batched self-play rollout, its token traces and its outputs, with the tiny model."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from sample_frames import mask_spans
from transformers import AutoTokenizer

from sparring.game_init import GameInitConfig, write_inits
from sparring.games import GameSpec
from sparring.games.matching import MatchingGame
from sparring.generation.base import SamplingParams
from sparring.generation.hf import HFBackend
from sparring.rollout import (
    RolloutConfig,
    build_policies,
    load_inits,
    play,
    rollout_stats,
    write_outputs,
)

GAME = {"k": 3, "max_turns": 4}


@pytest.fixture(scope="module")
def inits(tmp_path_factory):
    paths = write_inits(
        GameInitConfig(game={"params": GAME}, num_train=4, num_val=2),
        tmp_path_factory.mktemp("inits"),
    )
    return load_inits(paths["train"])


@pytest.fixture(scope="module")
def backend(tiny_model_dir):
    return HFBackend(str(tiny_model_dir), device="cpu")


def config(**kw) -> RolloutConfig:
    sampling = kw.pop("sampling", SamplingParams(temperature=1.0, max_new_tokens=12, seed=0))
    return RolloutConfig(game={"params": GAME}, games_per_init=2, sampling=sampling, **kw)


@pytest.fixture(scope="module")
def result(inits, backend):
    return play(inits, {"policy": backend}, config(), progress=False)


def test_all_games_finish_with_one_generate_call_per_step(result):
    assert len(result.episodes) == 8 and all(len(e.rewards) == 2 for e in result.episodes)
    # 8 games x up to 4 turns x 3 tries each would be up to 96 calls game-by-game; batched,
    # there is at most one call per (turn, try) step.
    assert result.generate_calls <= 4 * 3
    groups = pd.Series([e.init_id for e in result.episodes]).value_counts()
    assert (groups == 2).all()  # games_per_init plays of every initial state


def test_assistant_mask_decodes_to_exactly_the_seats_own_replies(result, backend):
    tok = backend.tokenizer
    for row in result.samples:
        replies = [m["content"] for m in row["messages"] if m["role"] == "assistant"]
        spans = mask_spans(row["assistant_mask"])
        decoded = [tok.decode(row["input_ids"][a:b], skip_special_tokens=True) for a, b in spans]
        assert decoded == replies
        last = max(b for _, b in spans) - 1
        assert row["token_rewards"][last] == row["reward"]
        assert sum(row["token_rewards"]) == pytest.approx(row["reward"])
        assert len(row["input_ids"]) == len(row["assistant_mask"]) == len(row["token_rewards"])
        assert row["game"] == row["game_id"] and row["init"] == row["init_id"]
        assert row["role"] in ("player_a", "player_b")


def test_model_tokens_match_the_chat_template_outside_replies(result, backend):
    # Reply ids are the model's own (possibly a non-canonical tokenization of their text, or
    # bytes of a split UTF-8 char), checked span by span above. Everything else (scaffolding,
    # partner messages, errors) must be exactly the chat template's text.
    tok = backend.tokenizer
    for row in result.samples:
        blanked = [{**m, "content": ""} if m["role"] == "assistant" else m for m in row["messages"]]
        expected = tok.apply_chat_template(blanked, tokenize=False)
        kept = [
            t
            for t, m in zip(row["input_ids"], row["assistant_mask"], strict=True)
            if m == 0 or t == tok.eos_token_id
        ]
        # samples end at the last reply token: "\n" (or a length-cut reply's <|im_end|>) follows
        closing = "\n" if row["input_ids"][-1] == tok.eos_token_id else "<|im_end|>\n"
        assert expected == tok.decode(kept) + closing


def test_scripted_turns_tokenize_exactly_like_the_chat_template(inits, tiny_model_dir):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    agent = MatchingGame.make_agent("matching-scripted")
    cfg = RolloutConfig(
        game={"params": {"k": 3}}, games_per_init=1, seats=["matching-scripted"] * 2
    )
    res = play(inits, {"matching-scripted": agent}, cfg, progress=False, scripted_tokenizer=tok)
    assert len(res.samples) == 8
    for row in res.samples:
        whole = tok.apply_chat_template(row["messages"], tokenize=True)["input_ids"]
        # identical ids, except the trailing "\n" after the last <|im_end|> that samples drop
        assert whole[: len(row["input_ids"])] == row["input_ids"]
        assert len(whole) == len(row["input_ids"]) + 1


def test_greedy_rollouts_are_deterministic(inits, backend):
    greedy = SamplingParams(temperature=0.0, max_new_tokens=12)
    a = play(inits, {"policy": backend}, config(sampling=greedy), progress=False)
    b = play(inits, {"policy": backend}, config(sampling=greedy), progress=False)
    assert [e.transcript for e in a.episodes] == [e.transcript for e in b.episodes]


def test_seeded_sampling_is_reproducible(inits, backend):
    a = play(inits[:2], {"policy": backend}, config(), progress=False)
    b = play(inits[:2], {"policy": backend}, config(), progress=False)
    assert [e.transcript for e in a.episodes] == [e.transcript for e in b.episodes]


def test_a_pool_of_live_games_plays_the_same_games(inits, tiny_model_dir, result):
    """`max_live_games=3`: at most 3 games in flight (so at most 3 prompts per generate call,
    one pending seat per matching game), and every game, sampled, is the game it was with all
    8 in flight: its draws follow its own steps, not the schedule."""

    class Sizes(HFBackend):  # records each generate call's batch size
        def generate(self, prompts, *args, **kwargs):
            self.sizes.append(len(prompts))
            return super().generate(prompts, *args, **kwargs)

    pooled = Sizes(str(tiny_model_dir), device="cpu")
    pooled.sizes = []
    res = play(inits, {"policy": pooled}, config(max_live_games=3), progress=False)
    assert max(pooled.sizes) == 3 and len(pooled.sizes) > result.generate_calls
    assert [e.transcript for e in res.episodes] == [e.transcript for e in result.episodes]
    assert not pooled._sessions  # finished games released their seats' caches


def test_mixed_seats_model_against_scripted(inits, backend):
    cfg = config(seats=["policy", "matching-scripted"])
    res = play(
        inits,
        {"policy": backend, "matching-scripted": MatchingGame.make_agent("matching-scripted")},
        cfg,
        progress=False,
    )
    assert all(r["seat"] == 0 and r["policy"] == "policy" for r in res.samples)
    assert all(e.seat_policies == ["policy", "matching-scripted"] for e in res.episodes)


def test_context_limit_truncates_instead_of_crashing(inits, backend):
    cfg = config(max_context_tokens=200)  # the k=3 system prompt alone is ~150 tokens
    res = play(inits[:1], {"policy": backend}, cfg, progress=False)
    assert all(e.truncated and e.rewards == [0.0, 0.0] for e in res.episodes)


def test_outputs_on_disk(result, tmp_path):
    paths = write_outputs(result, tmp_path)
    games = [json.loads(line) for line in paths["games"].read_text().splitlines()]
    assert len(games) == 8
    for g in games:
        assert {"transcript", "rewards", "num_turns", "seed", "invalid_actions", "state"} <= set(g)
    df = pd.read_parquet(paths["samples"])
    assert len(df) == 16
    need = {
        "input_ids",
        "assistant_mask",
        "token_rewards",
        "normalized_reward",
        "game",
        "init",
        "role",
        "data_source",
        "prompt",
        "reward_model",
        "messages",
    }
    assert need <= set(df.columns)
    rm = df.reward_model.iloc[0]
    assert json.loads(rm["game_state"])["k"] == 3
    assert df.prompt.iloc[0][0]["role"] == "system"


def test_stats_are_the_generic_metrics_and_the_games_own(result):
    stats = rollout_stats(result)
    agreed = [e.outcome["agreed"] for e in result.episodes]
    assert stats["rollout/games"] == 8
    assert stats["rollout/agreement_rate"] == sum(agreed) / 8  # matching's episode_metrics
    assert all(k.count("/") == 1 for k in stats)  # matching declares no role breakdown


def test_bad_seat_config_is_a_clear_error(inits, backend):
    with pytest.raises(ValueError, match="were not provided"):
        play(inits, {"policy": backend}, config(seats=["policy", "nobody"]), progress=False)
    with pytest.raises(ValueError, match="2 seats but 1"):
        play(inits, {"policy": backend}, config(seats=["policy"]), progress=False)
    with pytest.raises(ValueError, match="max_context_tokens"):
        RolloutConfig(max_context_tokens=64, sampling=SamplingParams(max_new_tokens=64))


def test_names_with_one_checkpoint_share_one_model(inits, tiny_model_dir):
    """Two opponents at the same path (e.g. past-1 and past-2 early in a run) load it once,
    and the rollout counts the shared backend's generated tokens once."""
    path = str(tiny_model_dir)
    policies = build_policies(
        GameSpec(), None, ["old", "older"], "cpu", extra_models={"old": path, "older": path}
    )
    assert policies["old"] is policies["older"]
    res = play(inits, policies, config(seats=["old", "older"]), progress=False)
    assert res.generated_tokens == policies["old"].generated_tokens > 0


def test_rejected_mask_marks_exactly_the_replies_the_game_rejected(result, backend):
    games, tok, rejected_in_all = {e.game_id: e for e in result.episodes}, backend.tokenizer, 0
    for row in result.samples:
        turns = games[row["game_id"]].transcript
        errors = [t["text"] for t in turns if t["seat"] == row["seat"] and not t["ok"]]
        spans = mask_spans(row["rejected_mask"])
        assert [tok.decode(row["input_ids"][a:b], skip_special_tokens=True) for a, b in spans] == (
            errors
        )
        rejected_in_all += len(errors)
    assert rejected_in_all > 0  # the untrained tiny model makes invalid moves
