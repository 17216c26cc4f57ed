"""`rollout.choose_legal` on Kuhn Poker with the tiny model: every reply is a legal move, each
drawn with the probability Kuhn Poker's readout gives it (so the readout is the policy that
plays), greedy play is the readout's better move, and the samples' log-probs are the
trainer's."""

from __future__ import annotations

import math
from collections import defaultdict

import pytest
import torch

pytest.importorskip("textarena")
pytest.importorskip("pyspiel")

from sparring.game_init import GameInitConfig, write_inits  # noqa: E402
from sparring.games.textarena import exploitability as kuhn  # noqa: E402
from sparring.generation.base import SamplingParams  # noqa: E402
from sparring.rollout import RolloutConfig, build_policies, load_inits, play  # noqa: E402
from sparring.samples import read_samples, write_samples  # noqa: E402
from sparring.train import GRPOConfig, batched_log_probs, collate, load_model  # noqa: E402

GAME = {"name": "kuhn-poker", "params": {"max_rounds": 1, "restate_card": True}}


def rollout(model_dir, tmp_path, temperature: float, games: int):
    """`games` self-play games of one hand, `choose_legal`, from 32 dealt states."""
    inits = load_inits(write_inits(GameInitConfig(game=GAME, num_train=32), tmp_path)["train"])
    sampling = SamplingParams(temperature=temperature, max_new_tokens=8, seed=0)
    cfg = RolloutConfig(game=GAME, games_per_init=games // 32, sampling=sampling,
                        choose_legal=True)  # fmt: skip
    policies = build_policies(cfg.game, str(model_dir), None, device="cpu")
    return cfg, policies["policy"], play(inits, policies, cfg, progress=False)


@pytest.fixture(scope="module")
def sampled(tiny_model_dir, tmp_path_factory):
    """128 games at T = 1."""
    return rollout(tiny_model_dir, tmp_path_factory.mktemp("choose-legal"), 1.0, 128)


def decisions(cfg: RolloutConfig, episode) -> list[tuple[str, str]]:
    """(open_spiel information state, open_spiel action) of each move of `episode`, replayed."""
    game = cfg.game.make()
    game.reset(episode.state)
    out = []
    for turn in episode.transcript:
        out.append((kuhn.info_state(game, turn["seat"]), kuhn.MOVES[turn["text"].strip("[]")]))
        game.step(turn["seat"], turn["text"])
    return out


def test_each_move_is_legal_and_drawn_as_the_readout_says(sampled):
    """128 games at T = 1: no invalid reply, and at each information set met 25 times or more
    (the openings at least) the share of bets or calls is the readout's P(bet or call) within
    4 standard errors."""
    cfg, backend, result = sampled
    table = kuhn.read_policy(backend, cfg.game.make(), 1.0)
    bets: dict[str, list[bool]] = defaultdict(list)
    for ep in result.episodes:
        assert not any(ep.invalid_actions) and all(t["ok"] for t in ep.transcript)
        for state, action in decisions(cfg, ep):
            bets[state].append(action == "Bet")
    checked = 0
    for state, seen in bets.items():
        if len(seen) >= 25:
            p = table[state]["Bet"]
            se = math.sqrt(p * (1 - p) / len(seen))
            assert abs(sum(seen) / len(seen) - p) <= 4 * se + 1e-9, state
            checked += 1
    assert checked >= 4
    assert {t["text"] for ep in result.episodes for t in ep.transcript} <= {
        "[check]", "[bet]", "[fold]", "[call]"
    }  # fmt: skip


def test_the_samples_log_probs_are_the_trainers(sampled, tiny_model_dir, tmp_path):
    """The chosen replies' rollout log-probs (teacher-forced at T = 1) are what the trainer
    recomputes: no mismatch to correct."""
    _, backend, result = sampled
    df = read_samples(write_samples(result.samples, tmp_path / "samples.parquet"))
    assert df.rollout_log_probs.notna().all()
    model = load_model(str(tiny_model_dir), torch.device("cpu"))
    batch = collate(df.iloc[:8], backend.tokenizer.pad_token_id)
    old = batched_log_probs(model, batch, range(8), GRPOConfig(), torch.device("cpu"))
    gap = (old - batch.rollout_log_prob)[batch.response_mask.bool()].abs()
    assert gap.max() < 1e-4


def test_greedy_plays_the_readouts_better_move(tiny_model_dir, tmp_path):
    """At T = 0 each move is the one the greedy readout picks."""
    cfg, backend, result = rollout(tiny_model_dir, tmp_path, 0.0, 32)
    greedy = kuhn.read_policy(backend, cfg.game.make(), 0.0)
    for ep in result.episodes:
        for state, action in decisions(cfg, ep):
            assert greedy[state][action] == 1.0


def test_choose_legal_needs_listed_moves_and_whole_reply_sampling():
    """Diplomacy lists no moves; top-p would change which whole replies can be drawn; only the
    hf engine scores replies."""
    with pytest.raises(ValueError, match="top_p"):
        RolloutConfig(game=GAME, choose_legal=True, sampling=SamplingParams(top_p=0.9))
    with pytest.raises(ValueError, match="hf engine"):
        RolloutConfig(game=GAME, choose_legal=True, backend={"name": "sglang"})
    pytest.importorskip("diplomacy")
    with pytest.raises(ValueError, match="does not list its legal moves"):
        RolloutConfig(game={"name": "diplomacy"}, choose_legal=True)


def test_a_recipe_evaluates_as_it_trains():
    """`rollout.choose_legal` carries to the evaluation unless it sets its own; not on verl."""
    from sparring.loop.config import PipelineConfig

    recipe = {"game": GAME, "rollout": {"choose_legal": True}}
    assert PipelineConfig.model_validate(recipe).eval.rollout.choose_legal
    recipe["eval"] = {"rollout": {"choose_legal": False}}
    assert not PipelineConfig.model_validate(recipe).eval.rollout.choose_legal
    with pytest.raises(ValueError, match="choose_legal is for the torch route"):
        PipelineConfig.model_validate(recipe | {"train_backend": "verl"})
