"""Matching's legal moves (`rollout.choose_legal`): every listed reply is one the game takes,
the lists follow the turn (share or propose; accept or reject), the tables they fit are
bounded, and a rollout of the tiny model that chooses among them plays only those replies."""

from __future__ import annotations

import itertools

import pytest
import torch

from sparring.game_init import GameInitConfig, write_inits
from sparring.games import make_game
from sparring.games.matching import MatchingGame
from sparring.generation.base import SamplingParams
from sparring.rollout import RolloutConfig, build_policies, load_inits, play

GAME = {"name": "matching", "params": {"k": 3, "max_turns": 8}}


@pytest.mark.parametrize("k", [2, 3, 4])
def test_every_listed_move_is_taken_and_the_lists_follow_the_turn(k):
    """Unanswered: one message sharing every visible cell (as the scripted agent's full share)
    and the k! proposals, each a different plan; pending a proposal: accept or reject."""
    game = make_game("matching", k=k)
    game.reset(game.generate_state(k))
    share, *plans = game.legal_moves(0)
    assert len(plans) == len(set(plans)) == len(list(itertools.permutations(range(k))))
    seen = sum(v is not None for row in game.state["views"][0] for v in row)
    assert share.startswith("[message] ") and share.count(";") == seen - 1
    for text in [share, *plans]:
        action, error = game.parse(text)
        assert error is None and action["type"] in ("message", "propose"), text
    assert game.step(0, share).ok  # seat 1 hears every cell seat 0 sees
    assert game.messages(1)[-1]["content"].startswith("Partner: " + share)
    plan = game.legal_moves(1)[-1]
    assert game.step(1, plan).ok
    assert game.legal_moves(0) == ["[accept]", "[reject]"]
    assert game.step(0, "[reject]").ok and game.legal_moves(0)[1:] == plans  # its turn again


def test_choose_legal_takes_matching_up_to_k4_only():
    RolloutConfig(game={"name": "matching", "params": {"k": 4}}, choose_legal=True)
    with pytest.raises(ValueError, match="up to k=4.*40320 at k=8"):
        RolloutConfig(game={"name": "matching", "params": {"k": 8}}, choose_legal=True)
    assert MatchingGame.choose_legal_refused({"k": 3}) is None


def test_the_tiny_model_choosing_plays_only_listed_replies(tiny_model_dir, tmp_path):
    """8 self-play games at k=3: every turn is one of the moves listed then (no invalid
    action), the samples' replies are the turns' texts, and the games end in a deal or at
    the cap."""
    inits = load_inits(
        write_inits(GameInitConfig(game=GAME, num_train=8, num_val=0), tmp_path)["train"]
    )
    sampling = SamplingParams(temperature=1.0, max_new_tokens=8, seed=0)
    cfg = RolloutConfig(game=GAME, games_per_init=1, sampling=sampling, choose_legal=True)
    policies = build_policies(cfg.game, str(tiny_model_dir), None, device="cpu")
    result = play(inits, policies, cfg, progress=False)
    assert len(result.episodes) == 8
    kinds = set()
    for ep in result.episodes:
        game = cfg.game.make()
        game.reset(ep.state)
        for turn in ep.transcript:
            assert turn["text"] in game.legal_moves(turn["seat"])
            assert game.step(turn["seat"], turn["text"]).ok
            kinds.add(turn["text"].split()[0])
        assert game.done and sum(ep.invalid_actions) == 0 and ep.rewards == game.rewards
        assert ep.outcome["agreed"] or len(ep.transcript) == 8
    assert {"[message]", "[propose]"} <= kinds


def test_by_kind_draws_the_kind_by_its_first_word_then_the_move(tiny_model_dir):
    """`choose_legal: by_kind`: over 600 draws from one k=3 turn, each kind ([message] or
    [propose]) comes up as often as the probability of the tokens spelling its word says, and
    within [propose] each plan as often as the rest of its text says; by whole text, the
    30-token share is drawn as often as its whole probability says. The chosen reply's
    log-probs are its tokens' own."""
    from sparring.generation.hf import HFBackend

    backend = HFBackend(str(tiny_model_dir), device="cpu")
    game = make_game("matching", k=3, random_names=False)
    game.reset(game.generate_state(0))
    prompt = list(backend.tokenizer.apply_chat_template(
        game.messages(0), add_generation_prompt=True, return_dict=True)["input_ids"])  # fmt: skip
    moves = game.legal_moves(0)
    ids = [backend.tokenizer.encode(m, add_special_tokens=False) + [backend.tokenizer.eos_token_id]
           for m in moves]  # fmt: skip
    scores = backend.score([prompt] * len(moves), ids, 1.0)
    cut = [backend._kind_tokens(m, i) for m, i in zip(moves, ids, strict=True)]
    head = {m.split()[0]: sum(s[:c]) for m, s, c in zip(moves, scores, cut, strict=True)}
    p_kind = torch.softmax(torch.tensor(list(head.values())), 0)  # [message], [propose]
    rest = [sum(s[c:]) for s, c in zip(scores[1:], cut[1:], strict=True)]  # the 6 plans
    plans = torch.softmax(torch.tensor(rest), 0)
    whole = torch.softmax(torch.tensor([sum(s) for s in scores]), 0)
    n = 600
    params = SamplingParams(temperature=1.0, seed=3)
    for by_kind in (True, False):
        drawn = backend.choose([prompt] * n, [moves] * n, params, None, by_kind)
        counts = torch.tensor([sum(d.text == m for d in drawn) for m in moves], dtype=torch.float)
        want = torch.cat([p_kind[:1], p_kind[1] * plans]) if by_kind else whole
        assert torch.allclose(counts / n, want, atol=4 * (0.25 / n) ** 0.5), (by_kind, counts, want)
        for d in drawn[:5]:
            assert d.log_probs == pytest.approx(scores[moves.index(d.text)], abs=1e-4)
    RolloutConfig(game=GAME, choose_legal="by_kind")
