"""The matching game's baselines: the exact ones on three k=3 tables worked by hand, and all
of them in `evaluate` next to the tiny model, on the same states."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from sparring.evaluate import EvalConfig, evaluate
from sparring.games.matching import MatchingGame
from sparring.games.matching.baselines import (
    identity_deal,
    no_communication_ceiling,
    own_view_deal,
    random_deal,
)
from sparring.games.matching.table import PAPERS, REVIEWERS, own_view_values


def hand_state(table: list[list[int]], best: int, seen: list[set[tuple[int, int]]]) -> dict:
    """A k=3 state with this table and the cells each seat sees (private scale 1). A cell seen
    by neither keeps its value, which the generator would set to 50; no baseline needs that."""
    k, t = len(table), np.array(table)
    visible = np.array([[[(r, p) in cells for p in range(k)] for r in range(k)] for cells in seen])
    views = [np.where(v, t, None).tolist() for v in visible]
    own = own_view_values(t, visible)
    return {
        "seed": 0, "k": k, "reviewers": list(REVIEWERS[:k]), "papers": list(PAPERS[:k]),
        "table": table, "views": views, "scales": [1.0, 1.0], "best_value": float(best),
        "best_assignment": [], "own_best_values": own, "attempts": 1, "hard": False,
    }  # fmt: skip


ROWS_1_2 = {(r, p) for r in (1, 2) for p in range(3)}
ALL = {(r, p) for r in range(3) for p in range(3)}
STATES = [
    # A: best 240 = the identity (90+80+70); sum 420.
    # Seat 0 sees (0,0)=90 (0,1)=10 (2,1)=60; its guess (unseen = 50) values the identity
    # 90+50+50 = 190 and 0->0 1->2 2->1 90+50+60 = 200, the unique best of the six; true value
    # 90+40+60 = 190. Seat 1 sees (0,1)=10 (1,2)=40 (2,1)=60: 0->2 1->0 2->1 scores
    # 50+50+60 = 160, the unique best (the identity, 0->0 1->2 2->1 and 0->2 1->1 2->0 all
    # 150); true value 20+30+60 = 110.
    hand_state(
        [[90, 10, 20], [30, 80, 40], [20, 60, 70]], 240, [{(0, 0), (0, 1), (2, 1)}, {(0, 1), (1, 2), (2, 1)}]
    ),
    # B: best 180 = 0->1 1->2 2->0 (60 each); sum 270; the identity scores 0.
    # Seat 0 sees rows 0-1: 0->1 1->2 2->0 guesses 60+60+50 = 170, the unique best; true 180.
    # Seat 1 sees everything: 180.
    hand_state([[0, 60, 30], [30, 0, 60], [60, 30, 0]], 180, [{(r, p) for r in (0, 1) for p in range(3)}, ALL]),
    # C: 90 on the diagonal, 0 elsewhere: best 270 = the identity; sum 270.
    # Seat 0 sees rows 1-2: the identity guesses 50+90+90 = 230, the unique best; true 270.
    # Seat 1 sees (0,1) (0,2) (1,2), all 0: the identity guesses 150, every other one <= 100.
    hand_state([[90, 0, 0], [0, 90, 0], [0, 0, 90]], 270, [ROWS_1_2, {(0, 1), (0, 2), (1, 2)}]),
]  # fmt: skip


def test_own_view_values_follow_the_generators_rule():
    assert [s["own_best_values"] for s in STATES] == [[190, 110], [180, 180], [270, 270]]


@pytest.mark.parametrize(
    ("baseline", "expected"),
    [
        # the mean over all 6 assignments = the table's sum / 3, over the best:
        # A 420/3/240 = 7/12; B 270/3/180 = 1/2; C 270/3/270 = 1/3 (B by enumeration:
        # 0, 90, 90, 180, 90, 90 -> 540/6 = 90)
        (random_deal, [7 / 12, 1 / 2, 1 / 3]),
        (identity_deal, [1.0, 0.0, 1.0]),  # A 240/240, B 0/180, C 270/270
        (own_view_deal, [150 / 240, 1.0, 1.0]),  # A (190+110)/2 = 150
        (no_communication_ceiling, [190 / 240, 1.0, 1.0]),  # A max(190, 110)
    ],
)
def test_exact_baselines_on_hand_tables(baseline, expected):
    assert [baseline(s) for s in STATES] == pytest.approx(expected)


def test_the_deal_baselines_are_what_a_proposal_and_an_accept_score():
    state = STATES[0]
    game = MatchingGame(k=3, random_names=False)
    for cols, value in [((0, 1, 2), identity_deal(state)), ((0, 2, 1), 190 / 240)]:
        game.reset(state)
        assert game.step(0, game.render_proposal(list(cols))).ok
        assert game.step(1, "[accept]").ok
        assert game.rewards == pytest.approx([value, value])


def test_matching_declares_four_trivial_or_exact_and_one_played_baseline():
    baselines = {b.name: b for b in MatchingGame.baselines()}
    assert {n for n, b in baselines.items() if b.trivial} == {
        "random-deal",
        "identity-deal",
        "own-view-deal",
    }
    assert baselines["matching-scripted"].agent == "matching-scripted"
    assert all(b.mode == "selfplay" for b in baselines.values())


def test_evaluate_reports_them_next_to_the_tiny_model(tiny_model_dir, tmp_path):
    from sparring.generation.hf import HFBackend

    inits = tmp_path / "val.parquet"
    rows = [{"init_id": f"hand-{i}", "state": json.dumps(s)} for i, s in enumerate(STATES)]
    pd.DataFrame(rows).to_parquet(inits)
    game = {"params": {"k": 3, "random_names": False, "max_turns": 4, "max_retries": 0}}
    rollout = {"game": game, "sampling": {"temperature": 0.0, "max_new_tokens": 4}}
    cfg = EvalConfig(rollout=rollout, modes=["selfplay"])
    model = HFBackend(str(tiny_model_dir), device="cpu")
    metrics, episodes = evaluate(model, inits, cfg, progress=False)
    # the means over A, B, C of the hand values above
    assert metrics["eval/baseline/random-deal"] == pytest.approx((7 / 12 + 1 / 2 + 1 / 3) / 3)
    assert metrics["eval/baseline/identity-deal"] == pytest.approx(2 / 3)
    assert metrics["eval/baseline/own-view-deal"] == pytest.approx((150 / 240 + 2) / 3)
    assert metrics["eval/baseline/no-communication"] == pytest.approx((190 / 240 + 2) / 3)
    # own view: A .625, B 1, C 1 -> mean .875, se = std(.625, 1, 1) / sqrt(3) = .125
    assert metrics["eval/baseline/own-view-deal_se"] == pytest.approx(0.125)
    # matching-scripted in both seats, 4 turns: seat 0 shares, seat 1 proposes the best of
    # what it knows, seat 0 accepts a plan worth >= 0.9 of its own (a played game, not a formula)
    assert 0 < metrics["eval/baseline/matching-scripted"] <= 1
    # the model played the same three states; the best trivial baseline is own view (.875)
    model_rewards = np.array([np.mean(e.rewards) for e in episodes["selfplay"]])
    assert [e.init_id.split("/")[0] for e in episodes["selfplay"]] == ["hand-0", "hand-1", "hand-2"]
    gain = model_rewards - np.array([150 / 240, 1, 1])
    assert metrics["eval/gain_over_best_trivial"] == pytest.approx(gain.mean())
    assert metrics["eval/gain_over_best_trivial_se"] == pytest.approx(gain.std(ddof=1) / np.sqrt(3))
