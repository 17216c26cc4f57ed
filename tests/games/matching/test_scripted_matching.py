"""The scripted baseline for the matching game."""

from __future__ import annotations

import numpy as np

from sparring.games import make_game
from sparring.games.matching import MatchingGame


def play_scripted(k: int, seeds: range, **params) -> list[float]:
    rewards = []
    for seed in seeds:
        game = make_game("matching", k=k, **params)
        game.reset(game.generate_state(seed))
        agent = MatchingGame.make_agent("matching-scripted")
        while not game.done:
            seat = game.current_seat
            assert game.step(seat, agent.act(game, seat)).ok  # never makes an illegal move
        rewards.append(game.rewards[0])
    return rewards


def test_scripted_self_play_reaches_high_reward():
    for k, floor in [(4, 0.9), (8, 0.95)]:
        rewards = play_scripted(k, range(40))
        assert np.mean(rewards) >= floor, (k, np.mean(rewards))


def test_scripted_self_play_under_the_dialop_preset():
    # dialop's fixed two-word names, every try counted; humans averaged 0.921 in this setting
    rewards = play_scripted(8, range(12), preset="dialop")
    assert np.mean(rewards) >= 0.9, np.mean(rewards)


def test_scripted_agent_only_uses_its_own_view():
    # Changing the partner's private view must not change seat 0's opening message.
    game = make_game("matching", k=4)
    state = game.generate_state(5)
    game.reset(state)
    first = MatchingGame.make_agent("matching-scripted").act(game, 0)
    state2 = {**state, "views": [state["views"][0], [[None] * 4 for _ in range(4)]]}
    game.reset(state2)
    assert MatchingGame.make_agent("matching-scripted").act(game, 0) == first
