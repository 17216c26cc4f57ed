"""Opponent mix: self-play vs learner-against-pool seat plans, driven by the difficulty
schedule, closed into a loop with real scripted Diplomacy games."""

from __future__ import annotations

from collections import Counter

import pytest

from sparring.opponents import DifficultyConfig, DifficultySchedule, learner_rewards, plan_seats

ROLES = ("AUSTRIA", "ENGLAND", "FRANCE", "GERMANY", "ITALY", "RUSSIA", "TURKEY")
POOL = ["hold", "random-legal", "greedy"]


def test_pure_selfplay_seats_the_learner_everywhere():
    plan, rows = plan_seats(
        5, ROLES, DifficultySchedule(DifficultyConfig(pool=["hold"])), selfplay_fraction=1.0
    )
    assert plan == [["policy"] * 7] * 5
    assert {r["mode"] for r in rows} == {"selfplay"}


def test_mixed_games_balance_countries_and_follow_the_schedule():
    schedule = DifficultySchedule(DifficultyConfig(pool=POOL))
    schedule.levels = {"FRANCE": 2, "TURKEY": 1}
    plan, rows = plan_seats(40, ROLES, schedule, selfplay_fraction=0.25, seed=3)
    assert sum(r["mode"] == "selfplay" for r in rows) == 10
    mixed = [(seats, r) for seats, r in zip(plan, rows, strict=True) if r["mode"] == "vs_pool"]
    counts = Counter(r["learner_role"] for _, r in mixed)
    assert set(counts) == set(ROLES) and max(counts.values()) - min(counts.values()) <= 1
    for seats, row in mixed:
        country = row["learner_role"]
        assert seats.count("policy") == 1 and seats[ROLES.index(country)] == "policy"
        expected = {"FRANCE": "greedy", "TURKEY": "random-legal"}.get(country, "hold")
        assert row["opponent"] == expected and seats.count(expected) == 6
        assert row["level"] == POOL.index(expected)
    assert plan_seats(40, ROLES, schedule, selfplay_fraction=0.25, seed=3) == (plan, rows)


def test_a_uniform_draw_mixes_the_whole_pool_per_state_and_keeps_the_levels():
    schedule = DifficultySchedule(DifficultyConfig(pool=POOL, draw="uniform", window=1))
    plan, rows = plan_seats(300, ROLES, schedule, selfplay_fraction=0.5, seed=7)
    mixed = [(seats, r) for seats, r in zip(plan, rows, strict=True) if r["mode"] == "vs_pool"]
    counts = Counter(r["opponent"] for _, r in mixed)
    assert set(counts) == set(POOL) and min(counts.values()) > 30  # 150 states, ~50 each
    for seats, row in mixed:
        assert row["opponent"] == POOL[row["level"]] and seats.count(row["opponent"]) == 6
    assert plan_seats(300, ROLES, schedule, selfplay_fraction=0.5, seed=7) == (plan, rows)
    assert plan_seats(300, ROLES, schedule, selfplay_fraction=0.5, seed=8) != (plan, rows)
    # a role that wins every game would climb under `level`; under `uniform` nothing moves
    assert schedule.update(0, {"FRANCE": [1.0, 1.0]}) == {}
    assert schedule.level("FRANCE") == 0 and schedule.history[-1]["change"] == 0
    climbing = DifficultySchedule(DifficultyConfig(pool=POOL, window=1))
    assert climbing.update(0, {"FRANCE": [1.0, 1.0]}) == {"FRANCE": 1}


def test_bad_arguments_are_clear_errors():
    with pytest.raises(ValueError, match="selfplay_fraction"):
        plan_seats(
            4, ROLES, DifficultySchedule(DifficultyConfig(pool=["hold"])), selfplay_fraction=1.5
        )
    schedule = DifficultySchedule(DifficultyConfig(pool=["policy", "greedy"]))
    with pytest.raises(ValueError, match="can't also be a pool opponent"):
        plan_seats(4, ROLES, schedule)


def test_schedule_loop_with_scripted_games():
    """plan -> play -> learner_rewards -> update: a greedy 'learner' beats holding opponents,
    so its countries move up the pool."""
    pytest.importorskip("diplomacy")
    from sparring.games.diplomacy import DiplomacyGame

    make_agent = DiplomacyGame.make_agent
    from sparring.games import make_game
    from sparring.rollout import RolloutConfig, play

    game = make_game("diplomacy", horizon=1, press=False, stages=["opening"])
    inits = [(f"s{i}", game.generate_state(i)) for i in range(7)]
    schedule = DifficultySchedule(DifficultyConfig(pool=POOL, window=1, raise_above=0.18))
    plan, rows = plan_seats(len(inits), ROLES, schedule, seed=0)
    policies = {"policy": make_agent("greedy"), "hold": make_agent("hold")}
    cfg = RolloutConfig(
        game={"name": "diplomacy", "params": game.cfg.model_dump()}, games_per_init=1
    )
    episodes = play(inits, policies, cfg, progress=False, seat_plan=plan).episodes
    rewards = learner_rewards(episodes)
    assert sorted(rewards) == sorted(ROLES) and all(len(v) == 1 for v in rewards.values())
    changes = schedule.update(0, rewards)
    raised = {c for c, r in rewards.items() if r[0] > 0.18}
    assert raised and set(changes) == raised and all(v == 1 for v in changes.values())
    plan, rows = plan_seats(len(inits), ROLES, schedule, seed=0)
    assert {r["opponent"] for r in rows if r["learner_role"] in raised} == {"random-legal"}
