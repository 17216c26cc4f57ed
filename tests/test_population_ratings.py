"""The population's pure parts (sparring.population): config checks, seating, ratings and
the replacement, on hand-built episodes."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from sparring.loop.config import PipelineConfig
from sparring.population import Population, PopulationConfig, member_names, plan_seats
from sparring.rollout import Episode

ROLES = ("a", "b", "c")


def episode(seats: list[str], rewards: list[float]) -> Episode:
    """A finished game with only what the ratings read: who sat where, and the rewards."""
    n = len(seats)
    return Episode("g#0", "g", "x", 0, list(ROLES[:n]), seats, {}, rewards, 1, [0] * n,
                   [0] * n, [0] * n, [], [], {})  # fmt: skip


def test_bad_populations_are_refused_with_the_fix():
    with pytest.raises(ValidationError, match="greater than or equal to 1"):
        PopulationConfig(size=0)
    with pytest.raises(ValidationError, match="one list of roles per member"):
        PopulationConfig(size=2, roles=[["a"]])
    with pytest.raises(ValidationError, match="at least one role"):
        PopulationConfig(size=2, roles=[["a"], []])
    with pytest.raises(ValueError, match=r"unknown \['z'\], played by no member \['c'\]"):
        PopulationConfig(size=2, roles=[["a", "z"], ["b"]]).check_roles(ROLES)
    PopulationConfig(size=2, roles=[["a", "c"], ["b", "c"]]).check_roles(ROLES)  # overlap is fine


def test_the_recipe_checks_the_roles_against_its_game_and_what_a_population_needs():
    game = {"name": "matching", "params": {"k": 3}}
    with pytest.raises(ValidationError, match="played by no member"):
        PipelineConfig.model_validate({"game": game, "population": {"size": 1, "roles": [["x"]]}})
    mixed = {"selfplay_fraction": 0.5, "difficulty": {"pool": ["matching-scripted"]}}
    with pytest.raises(ValidationError, match=r"needs pure self-play .*; or set population: null"):
        PipelineConfig.model_validate({"game": game, "population": {"size": 2}, "opponents": mixed})
    cfg = PipelineConfig.model_validate(
        {"game": game, "population": {"size": 2, "roles": [["player_a"], ["player_b"]]}}
    )
    assert cfg.population.players("player_b") == ["member-1"]


def test_seats_draw_each_role_from_its_players_and_balance_the_members():
    cfg = PopulationConfig(size=3, roles=[["a"], ["b", "c"], ["b", "c"]])
    plan = plan_seats(6, ROLES, cfg, seed=1)
    assert all(row[0] == "member-0" for row in plan)  # only member-0 plays a
    later = [m for row in plan for m in row[1:]]
    assert later.count("member-1") == later.count("member-2") == 6
    assert plan == plan_seats(6, ROLES, cfg, seed=1)  # seeded
    generalists = plan_seats(8, ROLES[:2], PopulationConfig(size=2), seed=0)
    assert all(sorted(row) == ["member-0", "member-1"] for row in generalists)  # mixed games


def test_ratings_follow_the_rewards_and_skip_games_of_one_member():
    population = Population(PopulationConfig(size=3))
    games = [episode(["member-0", "member-1"], [1.0, 0.0])] * 5
    games += [episode(["member-2", "member-2"], [1.0, 0.0])]  # one member: no rating event
    games += [episode(["member-0", "member-2", "member-0"], [0.0, 0.5, 1.0])]  # member-0: 0.5
    assert population.update(0, games) == 6
    assert population.ranking() == ["member-0", "member-2", "member-1"]
    mu0, sigma0 = population.ratings["member-0"]
    assert mu0 > 25 > population.ratings["member-1"][0] and sigma0 < 25 / 3
    # the draw with member-2 moved neither mean much: the two are tied in that game
    assert population.history[-1]["games_rated"] == 6
    assert population.metrics()["population/member-0/rating"] == pytest.approx(mu0 - 3 * sigma0)


def test_the_weakest_takes_the_strongest_at_the_interval_only():
    population = Population(PopulationConfig(size=2, replace_every=2))
    assert population.replace(2) == {}  # all tied: nobody is stronger
    population.update(0, [episode(["member-1", "member-0"], [1.0, 0.0])] * 3)
    assert population.replace(1) == {} and population.replace(3) == {}  # off the interval
    assert population.replace(2) == {"member-0": "member-1"}
    assert population.ratings["member-0"] == population.ratings["member-1"]
    assert population.history[-1] == {"iteration": 2, "replaced": "member-0", "by": "member-1"}
    assert Population(PopulationConfig(size=1, replace_every=1)).replace(1) == {}


def test_the_state_round_trips_through_json():
    population = Population(PopulationConfig(size=2, roles=[["a"], ["b"]], replace_every=1))
    population.update(0, [episode(["member-0", "member-1"], [0.0, 1.0])])
    back = Population.from_dict(json.loads(json.dumps(population.to_dict())))
    assert back.ratings == population.ratings and back.history == population.history
    assert back.cfg == population.cfg and member_names(2) == back.cfg.members
