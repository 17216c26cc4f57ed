"""Tic-Tac-Toe's baselines: the minimax player on positions worked by hand, and both baselines
in `evaluate` against the scripted opponent, on the same states as the policy."""

from __future__ import annotations

import pytest

pytest.importorskip("textarena")

from sparring.evaluate import EvalConfig, evaluate  # noqa: E402
from sparring.game_init import GameInitConfig, write_inits  # noqa: E402
from sparring.games import make_game  # noqa: E402
from sparring.games.textarena.agents import PerfectTicTacToeAgent, value  # noqa: E402

EMPTY = ("",) * 9


def board(rows: str) -> tuple[str, ...]:
    """`"OO.|OXX|..."` -> the nine cells, row by row."""
    return tuple("" if c == "." else c for c in rows.replace("|", ""))


def test_minimax_values_by_hand():
    assert value(EMPTY, "O") == 0  # perfect play draws
    # O to move wins at once with 2; 4 cells stay empty: +(4 + 1)
    assert value(board("OO.|XX.|..."), "O") == 5
    # X to move against two threats (2 and 6) blocks one; O wins with the other, leaving 2
    # cells empty: -(2 + 1). Any other move loses one move sooner: -4.
    assert value(board("OO.|OXX|..."), "X") == -3


def test_the_perfect_player_takes_the_best_move_first_in_preference_order():
    game = make_game("tic-tac-toe")
    game.reset(game.generate_state(0))
    agent = PerfectTicTacToeAgent()
    for move in ("[0]", "[4]", "[1]", "[5]", "[3]"):  # O O . / O X X / . . .
        assert game.step(game.current_seat, move).ok
    assert agent.act(game, game.current_seat) == "[2]"  # 2 and 6 both lose in 3; 2 comes first


def test_evaluate_plays_them_in_the_learners_seats_against_the_scripted_opponent(tmp_path):
    cfg = EvalConfig(rollout={"game": {"name": "tic-tac-toe"}}, modes=["vs_scripted"])
    inits = write_inits(GameInitConfig(game=cfg.game, num_train=1, num_val=4), tmp_path)["val"]
    policy = cfg.game.make_agent("tic-tac-toe-random")  # the policy under test plays like one
    metrics, _ = evaluate(policy, inits, cfg, progress=False)
    model = metrics["eval/vs_scripted/all/normalized_reward"]
    assert metrics["eval/baseline/tic-tac-toe-random"] == model  # the same seeded games
    assert metrics["eval/gain_over_best_trivial"] == 0.0
    # minimax never loses, and the scripted player blocks every single threat: all draws
    assert metrics["eval/baseline/tic-tac-toe-perfect"] == 0.5
    assert metrics["eval/baseline/tic-tac-toe-perfect_se"] == 0.0
