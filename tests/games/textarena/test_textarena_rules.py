"""The TextArena adapter: seeding, isolated randomness, the chat and `ok` contracts, rewards in
[0, 1], Kuhn Poker's chip fix, and the baselines (scripted beats random-legal)."""

from __future__ import annotations

import random

import numpy as np
import pytest

pytest.importorskip("textarena")

from sparring.games import GAMES, game_class, make_game  # noqa: E402
from sparring.games.textarena import KuhnPoker  # noqa: E402

TEXTARENA = {
    "kuhn-poker": {"max_rounds": 3},
    "tic-tac-toe": {},
    "simple-negotiation": {"max_turns": 6},
}


def play(name: str, seed: int, agents: tuple[str, str], **params) -> tuple:
    """A game between two baseline agents: (game, every step's result)."""
    game = make_game(name, **(TEXTARENA[name] | params))
    game.reset(game.generate_state(seed))
    seated = [game.make_agent(a) for a in agents]
    results = []
    while not game.done:
        seat = game.current_seat
        results.append(game.step(seat, seated[seat].act(game, seat)))
    return game, results


def test_every_textarena_game_is_registered_with_its_baselines():
    for name in TEXTARENA:
        cls = game_class(name)
        assert GAMES[name].startswith("sparring.games.textarena:")
        assert cls.roles == ("player_0", "player_1")
        assert cls.default_opponent in cls.agents and f"{name}-random" in cls.agents


@pytest.mark.parametrize("name", TEXTARENA)
def test_same_seed_same_game_even_interleaved(name):
    """A game's randomness is its own: interleaving games and drawing from `random` between
    moves changes nothing, and the caller's `random` stream is left as it was."""
    agents = (f"{name}-random", f"{name}-random")
    alone = [play(name, seed, agents)[0] for seed in (3, 4)]
    assert make_game(name).generate_state(3) == make_game(name).generate_state(3)
    games = [make_game(name, **TEXTARENA[name]) for _ in range(2)]
    for game, seed in zip(games, (3, 4), strict=True):
        game.reset(game.generate_state(seed))
    seated = [game_class(name).make_agent(a) for a in agents]
    random.seed(123)
    draws = []
    while not all(g.done for g in games):
        for game in games:
            if not game.done:
                seat = game.current_seat
                game.step(seat, seated[seat].act(game, seat))
                draws.append(random.random())
    random.seed(123)
    assert draws == [random.random() for _ in draws]  # nobody else drew from `random`
    for a, b in zip(alone, games, strict=True):
        assert [t.text for t in a.transcript] == [t.text for t in b.transcript]
        assert a.rewards == b.rewards and a.outcome() == b.outcome()


def test_different_seeds_deal_different_games():
    states = [make_game("kuhn-poker").generate_state(s)["game_state"] for s in range(12)]
    deals = {tuple(s["player_cards"].values()) for s in states}
    assert len(deals) == 6  # every deal of 2 of the 3 cards


@pytest.mark.parametrize("name", TEXTARENA)
def test_chat_contract(name):
    """One system message, then user/assistant alternating; the seat to move reads a user
    message last; its assistant messages are exactly its texts."""
    game, _ = play(name, 1, (f"{name}-scripted", f"{name}-random"))
    for seat in range(2):
        chat = game.messages(seat)
        assert chat[0]["role"] == "system" and f"Player {seat}" in chat[0]["content"]
        roles = [m["role"] for m in chat[1:]]
        assert roles[::2] == ["user"] * len(roles[::2])
        assert roles[1::2] == ["assistant"] * len(roles[1::2])
        mine = [t.text for t in game.transcript if t.seat == seat]
        assert [m["content"] for m in chat if m["role"] == "assistant"] == mine
    fresh = make_game(name, **TEXTARENA[name])
    fresh.reset(fresh.generate_state(1))
    assert fresh.messages(fresh.current_seat)[-1]["role"] == "user"


@pytest.mark.parametrize("name", ["kuhn-poker", "tic-tac-toe"])
def test_invalid_text_is_retried_then_forfeits_the_game(name):
    game = make_game(name, max_retries=1)
    game.reset(game.generate_state(0))
    seat = game.current_seat
    first = game.step(seat, "I am thinking about it")
    assert not first.ok and not first.forfeited and first.error
    assert game.pending_seats == [seat]  # the same seat moves again
    assert first.error in game.messages(seat)[-1]["content"]  # shown to the actor
    assert first.error not in game.messages(1 - seat)[-1]["content"]
    second = game.step(seat, "still thinking")
    assert not second.ok and second.forfeited and game.done
    assert game.rewards[seat] == 0.0 and game.rewards[1 - seat] == 1.0
    assert game.stats.invalid_actions[seat] == 2 and game.stats.forfeits[seat] == 1
    assert game.outcome()["forfeit"] == seat and game.num_turns == 1
    assert game.step(seat, "[0]").error == "the game is over"


def test_legal_moves_are_accepted_and_the_wrong_seat_is_refused():
    game = make_game("tic-tac-toe")
    game.reset(game.generate_state(0))
    assert game.step(1, "[4]").error == "it is not player_1's turn"
    assert game.step(0, "[4]").ok and game.pending_seats == [1]
    assert not game.step(1, "[4]").ok  # occupied: retry
    assert game.step(1, "[0]").ok and game.cells()[:5] == ["X", "", "", "", "O"]


def test_kuhn_bets_and_calls_reach_the_pot():
    """TextArena 0.7.4 never moves chips on bet/call; the adapter's env does (zero-sum)."""
    game = KuhnPoker(max_rounds=1)
    game.reset(game.generate_state(0))
    opener = game.current_seat  # player 1 opens the first hand
    assert game.step(opener, "[bet]").ok and game.step(1 - opener, "[call]").ok
    chips = game.outcome()["chips"]
    winner = game.outcome()["winner"]
    assert chips[winner] == 2 and chips[1 - winner] == -2  # ante + bet, both sides
    assert game.rewards[winner] == 1.0 and game.rewards[1 - winner] == 0.0


def test_rewards_are_win_draw_loss_in_unit_range_within_the_turn_budget():
    for name in TEXTARENA:
        budget = game_class(name).turn_budget(TEXTARENA[name])
        for seed in range(5):
            game, results = play(name, seed, (f"{name}-scripted", f"{name}-random"))
            r = game.rewards
            assert sorted(r) in ([0.0, 1.0], [0.5, 0.5])
            assert all(res.ok for res in results)  # baselines only make legal moves
            assert game.num_turns <= budget
            if name == "simple-negotiation":  # a trading game runs to its limit
                assert game.num_turns == budget


def test_turn_budgets_follow_the_rule_parameters_and_their_defaults():
    assert [game_class(n).turn_budget({}) for n in TEXTARENA] == [3 * 3, 9, 10 + 1]
    assert KuhnPoker.turn_budget({"max_rounds": 5}) == 15


def mean_reward(name: str, learner: str, opponent: str, seeds: range) -> float:
    """The learner's mean reward, half the games in each seat."""
    rewards = []
    for seed in seeds:
        seat = seed % 2
        agents = (learner, opponent) if seat == 0 else (opponent, learner)
        rewards.append(play(name, seed, agents)[0].rewards[seat])
    return float(np.mean(rewards))


@pytest.mark.parametrize(
    ("name", "floor"), [("kuhn-poker", 0.55), ("tic-tac-toe", 0.9), ("simple-negotiation", 0.8)]
)
def test_scripted_baseline_beats_random_legal(name, floor):
    assert mean_reward(name, f"{name}-scripted", f"{name}-random", range(120)) >= floor


def test_state_for_other_rules_is_refused():
    state = make_game("kuhn-poker", max_rounds=1).generate_state(0)
    with pytest.raises(ValueError, match="max_rounds"):
        make_game("kuhn-poker", max_rounds=3).reset(state)
    with pytest.raises(ValueError, match="deals seed 0 differently"):
        make_game("kuhn-poker", max_rounds=1).reset(
            {**state, "game_state": {**state["game_state"], "pot": 7}}
        )


def test_kuhn_restate_card_ends_every_decision_with_the_seats_card():
    """`restate_card`: each decision's observation ends with the seat's card of that hand,
    once, on a retry too; without it the card is said only when the hand is dealt."""
    game = make_game("kuhn-poker", max_rounds=2, restate_card=True)
    game.reset(game.generate_state(4))
    agent = game.make_agent("kuhn-poker-random")
    decisions = 0
    while not game.done:
        seat = game.current_seat
        last = game.messages(seat)[-1]["content"]
        cue = f"[GAME] Your card: {game.card(seat)}."
        assert last.endswith(cue) and last.count(cue) == 1
        if decisions == 0:  # an invalid move first: the retry's observation ends with the card
            assert not game.step(seat, "[raise]").ok
            assert game.messages(seat)[-1]["content"].endswith(cue)
        assert game.step(seat, agent.act(game, seat)).ok
        decisions += 1
    plain = make_game("kuhn-poker", max_rounds=2)
    plain.reset(plain.generate_state(4))
    assert "Your card:" not in plain.messages(plain.current_seat)[-1]["content"]


def test_kuhn_card_rank_names_the_rank_in_the_restated_card():
    named = {}
    for seed in range(12):  # deals that give the opener each card
        game = make_game("kuhn-poker", max_rounds=1, restate_card=True, card_rank=True)
        game.reset(game.generate_state(seed))
        card = game.card(game.current_seat)
        named[card] = game.messages(game.current_seat)[-1]["content"].rsplit("\n", 1)[-1]
    assert named == {
        "J": "[GAME] Your card: J, the lowest card.",
        "Q": "[GAME] Your card: Q, the middle card.",
        "K": "[GAME] Your card: K, the highest card.",
    }
