"""Evaluation is declarative: every lineup the game declares for each mode is played in one
batched rollout, and the results are named `eval/<mode>/<role>/*` (scripted policies: no model)."""

from __future__ import annotations

import pytest

import sparring.evaluate as evaluation
from sparring.evaluate import EvalConfig, evaluate, headline, lineups, write_eval
from sparring.game_init import GameInitConfig, write_inits
from sparring.games.base import Baseline

GAME = {"params": {"k": 3, "max_turns": 8}}
ROLES = ("player_a", "player_b")
GENERIC = {"normalized_reward", "normalized_reward_se", "invalid_rate", "turns", "words", "games"}


@pytest.fixture(scope="module")
def val(tmp_path_factory):
    out = tmp_path_factory.mktemp("inits")
    return write_inits(GameInitConfig(game=GAME, num_train=1, num_val=3), out)["val"]


@pytest.fixture
def plays(monkeypatch) -> list[int]:
    """The number of games of every `play` call evaluation makes."""
    calls, real = [], evaluation.play
    monkeypatch.setattr(evaluation, "play", lambda runs, *a, **k: calls.append(len(runs)) or real(runs, *a, **k))  # fmt: skip
    return calls


def test_every_mode_is_one_batched_rollout_named_by_mode_and_role(val, plays, tmp_path):
    cfg = EvalConfig(rollout={"game": GAME})
    agent = cfg.game.make_agent("matching-scripted")  # the policy under test, and the previous
    metrics, episodes = evaluate(agent, val, cfg, previous=agent, progress=False)
    assert plays == [3 * (1 + 2 + 2 + 1)]  # 3 states x (self-play, then each seat in two
    # modes, then the game's played baseline: matching-scripted in self-play)
    assert {m: len(e) for m, e in episodes.items()} == {
        "selfplay": 3,
        "vs_previous": 6,
        "vs_scripted": 6,
    }
    for mode in episodes:
        for role in ROLES:
            names = {k.split("/")[3] for k in metrics if k.startswith(f"eval/{mode}/{role}/")}
            assert names == GENERIC | {"agreement_rate", "reward_given_agreement"}  # matching's
        mean = [metrics[f"eval/{mode}/{r}/normalized_reward"] for r in ROLES]
        assert metrics[f"eval/{mode}/all/normalized_reward"] == pytest.approx(sum(mean) / 2)
    assert metrics["eval/selfplay/player_a/games"] == 3  # the learner holds both seats
    assert metrics["eval/vs_scripted/player_b/games"] == 3
    assert metrics["eval/selfplay/player_a/agreement_rate"] == 1.0  # scripted pairs agree
    # the policy under test is the scripted baseline itself: the same games, the same reward
    assert (
        metrics["eval/baseline/matching-scripted"] == metrics["eval/selfplay/all/normalized_reward"]
    )
    ids = [e.game_id.split("/", 1)[1] for e in episodes["vs_scripted"]]
    assert ids[0] == "vs_scripted/matching-scripted/player_a#0"
    assert ids[-1] == "vs_scripted/matching-scripted/player_b#0"
    assert episodes["selfplay"][0].game_id.endswith("/selfplay/policy/all#0")
    paths = write_eval(metrics, episodes, tmp_path, cfg.game)
    assert paths["plot"].read_bytes()[:4] == b"\x89PNG"
    first = headline(metrics)  # what `sparring evaluate` prints: rewards, baselines, the gain
    assert "eval/selfplay/player_a/normalized_reward_se" in first
    assert "eval/baseline/random-deal" in first and "eval/gain_over_best_trivial_se" in first
    assert not any(k.endswith(("invalid_rate", "agreement_rate")) for k in first)


def test_vs_previous_needs_a_previous_checkpoint(val, plays):
    cfg = EvalConfig(rollout={"game": GAME}, modes=["selfplay", "vs_previous"])
    assert [x.mode for x in lineups(cfg, previous=False)] == ["selfplay"]
    agent = cfg.game.make_agent("matching-scripted")
    metrics, episodes = evaluate(agent, val, cfg, progress=False)
    assert list(episodes) == ["selfplay"] and plays == [3 + 3]  # and the scripted baseline
    assert not any(k.startswith("eval/vs_previous/") for k in metrics)


def test_baselines_only_beside_an_evaluated_mode(val, plays):
    cfg = EvalConfig(rollout={"game": GAME}, modes=["vs_scripted"])  # matching's are self-play
    metrics, _ = evaluate(cfg.game.make_agent("matching-scripted"), val, cfg, progress=False)
    assert plays == [3 * 2] and not any("baseline" in k or "gain" in k for k in metrics)


def test_a_baseline_is_played_or_exact():
    with pytest.raises(ValueError, match="exactly one of agent and value"):
        Baseline("both", "selfplay", trivial=True, agent="matching-scripted", value=len)
    with pytest.raises(ValueError, match="exactly one of agent and value"):
        Baseline("neither", "selfplay", trivial=True)


def test_the_test_steps_evaluation_plays_no_baseline_and_no_added_lineup(val, plays):
    """`baselines: false` skips the played baseline; `breakdown: false` drops the lineups a
    game adds to a mode (Diplomacy's `vs_<bot>`, which matching has none of: same plan)."""
    cfg = EvalConfig(rollout={"game": GAME}, modes=["selfplay"], baselines=False)
    metrics, _ = evaluate(cfg.game.make_agent("matching-scripted"), val, cfg, progress=False)
    assert plays == [3] and not any("baseline" in k or "gain" in k for k in metrics)
    assert lineups(cfg.model_copy(update={"breakdown": False}), True) == lineups(cfg, True)


def test_without_the_breakdown_diplomacy_plays_only_its_modes_lineups():
    pytest.importorskip("diplomacy")
    game = {"name": "diplomacy", "params": {"horizon": 1, "press": False}}
    cfg = EvalConfig(rollout={"game": game}, modes=["vs_scripted"])
    every = lineups(cfg, previous=False)
    assert [x.mode for x in every][::7] == [
        "vs_scripted",
        "vs_hold",
        "vs_random-legal",
        "vs_support",
    ]
    own = lineups(cfg.model_copy(update={"breakdown": False}), previous=False)
    assert own == every[:7] and {x.seats.count("greedy") for x in own} == {6}
