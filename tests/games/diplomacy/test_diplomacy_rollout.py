"""Diplomacy through the batched rollout with the tiny model: self-play in all seven seats,
and the learner against an opponent mix (scripted bots and an earlier checkpoint)."""

from __future__ import annotations

import pytest

pytest.importorskip("diplomacy")

from sparring.games import make_game  # noqa: E402
from sparring.games.diplomacy import ROLES, DiplomacyGame  # noqa: E402
from sparring.generation.base import SamplingParams  # noqa: E402
from sparring.generation.hf import HFBackend  # noqa: E402
from sparring.opponents import DifficultyConfig, DifficultySchedule, learner_rewards, plan_seats  # noqa: E402  # noqa: E402
from sparring.rollout import RolloutConfig, play, rollout_stats  # noqa: E402

PARAMS = {"horizon": 1, "press": True, "press_rounds": 1}  # one year: 2 x (press, orders)


class CountingBackend(HFBackend):
    """The real HF backend, remembering the batch size of every generate call."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.batches: list[int] = []

    def generate(self, prompts, params, sessions=None, seeds=None):
        self.batches.append(len(prompts))
        return super().generate(prompts, params, sessions, seeds)


@pytest.fixture(scope="module")
def inits():
    game = make_game("diplomacy", **PARAMS)
    return [(f"d{seed}", game.generate_state(seed)) for seed in (2, 4)]  # 1901 and 1902


def config(**kw) -> RolloutConfig:
    sampling = SamplingParams(temperature=1.0, max_new_tokens=16, seed=0)
    return RolloutConfig(game={"name": "diplomacy", "params": PARAMS}, sampling=sampling, **kw)


def test_selfplay_in_all_seven_seats_batches_every_power_per_step(inits, tiny_model_dir):
    backend = CountingBackend(str(tiny_model_dir), device="cpu")
    res = play(inits, {"policy": backend}, config(games_per_init=2), progress=False)
    # one year = two movement phases of a press step and an orders step; each step asks all
    # 7 powers of all 4 games in one call
    assert res.generate_calls == 4 and backend.batches == [28] * 4
    assert all(len(e.transcript) == 28 and not e.truncated for e in res.episodes)
    assert len(res.samples) == 28
    for row in res.samples:
        stage = next(e for e in res.episodes if e.game_id == row["game_id"]).state["stage"]
        assert row["country"] == row["role"] == ROLES[row["seat"]]
        assert row["country_stage"] == f"{row['role']}/{stage}"
        assert row["country_alliance"].startswith(row["role"] + "/")  # the episode's year
        assert sum(row["assistant_mask"]) > 0 and row["token_rewards"][-1] == row["reward"]


def test_learner_against_bots_and_a_checkpoint_via_the_seat_plan(inits, tiny_model_dir):
    learner = CountingBackend(str(tiny_model_dir), device="cpu")
    previous = CountingBackend(str(tiny_model_dir), device="cpu")
    schedule = DifficultySchedule(DifficultyConfig(pool=["greedy", "previous"]))
    plan, rows = plan_seats(len(inits), ROLES, schedule, seed=1)
    schedule.levels[rows[1]["learner_role"]] = 1  # the second state's country is harder
    plan, rows = plan_seats(len(inits), ROLES, schedule, seed=1)
    assert [r["opponent"] for r in rows] == ["greedy", "previous"]
    policies = {
        "policy": learner,
        "previous": previous,
        "greedy": DiplomacyGame.make_agent("greedy"),
    }
    res = play(inits, policies, config(games_per_init=2), progress=False, seat_plan=plan)
    # per step: one call for the 4 learner seats, one for the 2 x 6 checkpoint seats
    assert learner.batches == [4] * 4 and previous.batches == [12] * 4
    learner_rows = [r for r in res.samples if r["policy"] == "policy"]
    assert len(learner_rows) == 4
    for row in learner_rows:
        assert row["country"] == rows[int(row["init_id"] == "d4")]["learner_role"]
        assert row["country_stage"].startswith(row["country"] + "/")
    rewards = learner_rewards(res.episodes)
    assert sorted(rewards) == sorted({r["learner_role"] for r in rows})
    assert sum(len(v) for v in rewards.values()) == 4
    # the rollout's stats (logged to MLflow per iteration) hold the learner's countries only
    stats = rollout_stats(res)
    countries = {k.split("/")[2] for k in stats if k.startswith("rollout/country/")}
    assert countries == set(rewards)
    for country, values in rewards.items():
        assert stats[f"rollout/country/{country}/games"] == len(values)
        assert stats[f"rollout/country/{country}/normalized_reward"] == pytest.approx(
            sum(values) / len(values)
        )
