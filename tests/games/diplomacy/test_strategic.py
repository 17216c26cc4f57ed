"""The strategic evaluator (`sparring.games.diplomacy.strategic`): conduct on hand-built
phases, scenario selection on hand-built center counts and from real play, scores of bots
played through the engine, the report, and the comparison's MLflow runs."""

from __future__ import annotations

import json
import random
import uuid

import pytest

pytest.importorskip("diplomacy")

from start_position import CENTERS, UNITS  # noqa: E402  the 1901 board, by power

from sparring.compare import MODEL_TAG, label_of, log_comparison, write_comparison  # noqa: E402
from sparring.games import GameSpec, make_game  # noqa: E402
from sparring.games.diplomacy import ROLES  # noqa: E402
from sparring.games.diplomacy.alliances import PhaseOrders, conduct, promises  # noqa: E402
from sparring.games.diplomacy.board import Engine  # noqa: E402
from sparring.games.diplomacy.bots import HoldBot  # noqa: E402
from sparring.games.diplomacy.report import strategic_cells  # noqa: E402
from sparring.games.diplomacy.scenarios import play_springs, position  # noqa: E402
from sparring.games.diplomacy.strategic import (  # noqa: E402
    StrategicConfig,
    evaluate_strategic,
    qualifies,
    scenario_sets,
)
from sparring.generation.base import SamplingParams  # noqa: E402
from sparring.rollout import play_games  # noqa: E402
from sparring.settings import TrackingConfig  # noqa: E402

NO_PRESS = GameSpec(name="diplomacy", params={"press": False})


def phase(name: str, press: tuple = (), **orders: list[str]) -> PhaseOrders:
    """A movement phase on the 1901 board: the given powers' orders, the others none."""
    return PhaseOrders({p: orders.get(p, []) for p in ROLES}, UNITS, CENTERS, name, press)


# ---- conduct -----------------------------------------------------------------------------------
def test_alliances_formed_in_the_first_year_and_kept_unless_attacked_later():
    # 1901: France supports Germany into Burgundy, Austria supports Russia into Galicia
    spring = phase(
        "S1901M",
        FRANCE=["A PAR S A MUN - BUR"],
        GERMANY=["A MUN - BUR"],
        AUSTRIA=["A VIE S A WAR - GAL"],
        RUSSIA=["A WAR - GAL"],
    )
    # 1902: Germany moves on Paris (French): France-Germany broken; Austria-Russia kept
    later = phase("S1902M", GERMANY=["A MUN - PAR"])
    found = conduct([spring, later])
    assert found["FRANCE"]["alliances_formed"] == 1 and found["FRANCE"]["alliances_kept"] == 0
    assert found["GERMANY"]["alliances_formed"] == 1 and found["GERMANY"]["alliances_kept"] == 0
    assert found["AUSTRIA"]["alliances_formed"] == 1 and found["AUSTRIA"]["alliances_kept"] == 1
    assert found["ITALY"]["alliances_formed"] == 0
    assert found["FRANCE"]["supports_given"] == 1 and found["FRANCE"]["supports_received"] == 0
    assert found["GERMANY"]["supports_received"] == 1 and found["GERMANY"]["supports_given"] == 0
    # one year only: every alliance formed counts as kept
    assert conduct([spring])["FRANCE"]["alliances_kept"] == 1


def test_promises_are_orders_for_the_senders_own_units_kept_when_given():
    press = (
        ("FRANCE", "I will move Army Paris to Burgundy and F BRE H"),  # two promises
        ("FRANCE", "Germany should play A MUN - RUH"),  # not France's unit: no promise
        ("GERMANY", "no orders here"),
    )
    ph = phase("S1901M", press, FRANCE=["A PAR - BUR", "F BRE - MAO"], GERMANY=["A MUN H"])
    assert promises(ph)["FRANCE"] == (2, 1)  # Paris kept, Brest broken
    assert promises(ph)["GERMANY"] == (0, 0)
    found = conduct([ph])
    assert (found["FRANCE"]["promises"], found["FRANCE"]["promises_kept"]) == (2, 1)


# ---- scenario selection ------------------------------------------------------------------------
def test_each_dimension_selects_its_positions():
    before = {"AUSTRIA": 6, "ENGLAND": 3, "FRANCE": 5, "GERMANY": 4, "ITALY": 4, "RUSSIA": 6}
    before["TURKEY"] = 4
    now = {**before, "AUSTRIA": 4, "RUSSIA": 8}  # Austria lost two, Russia gained two
    assert qualifies("crisis", 1905, now, before, "AUSTRIA")
    assert not qualifies("crisis", 1905, now, before, "FRANCE")  # lost none
    assert not qualifies("crisis", 1905, now, None, "AUSTRIA")  # no year before
    # strong: >= 5 centers and >= the third-largest holding (8, 5, 5 here: France's 5 is)
    assert qualifies("midgame", 1905, now, before, "RUSSIA")
    assert qualifies("midgame", 1905, now, before, "FRANCE")
    assert not qualifies("midgame", 1905, now, before, "GERMANY")  # 4 centers
    assert not qualifies("midgame", 1903, now, before, "RUSSIA")  # an opening year
    assert not qualifies("endgame", 1905, now, before, "RUSSIA")  # a midgame year
    assert qualifies("opening", 1901, now, None, "ENGLAND")
    assert qualifies("alliance", 1908, now, before, None)
    assert not qualifies("alliance", 1909, now, before, None)


def test_opening_sets_come_from_play_one_per_power_and_repeat():
    cfg = StrategicConfig(scenarios=1, dimensions=("opening",), trajectory_seed=3)
    sets = scenario_sets(cfg)
    assert list(sets) == ["opening"]
    assert sorted(s["power"] for s in sets["opening"]) == sorted(ROLES)
    for s in sets["opening"]:
        assert 1901 <= s["year"] <= 1903 and s["phase"] == f"S{s['year']}M"
        assert s["centers"][s["power"]]  # the power is alive
        engine = Engine()
        engine.set_state(s["engine"])  # a position the engine accepts
        assert engine.get_current_phase() == s["phase"]
    scenario_sets.cache_clear()
    assert scenario_sets(cfg) == sets  # the same config gives the same sets


# ---- playing and scoring -----------------------------------------------------------------------
def standard_start(power: str | None, dim: str) -> dict:
    """The 1901 start as a scenario of `dim` for `power`."""
    state = position(Engine(), {p: "greedy" for p in ROLES})
    return {**state, "seed": 0, "dimension": dim, "power": power, "trajectory": 0}


def test_scores_of_bots_played_through_the_engine():
    sets = {
        "opening": [standard_start(p, "opening") for p in ROLES],
        "alliance": [standard_start(None, "alliance")],
    }
    metrics = evaluate_strategic(HoldBot(), sets, play_games, NO_PRESS, SamplingParams(), "greedy")
    for p in ROLES:
        # holding from the start, every home center keeps its unit: greedy moves bounce off it
        assert metrics[f"strategic/opening/{p}/center_gain"] == 0.0
        assert metrics[f"strategic/opening/{p}/no_loss_rate"] == 1.0
        assert metrics[f"strategic/opening/{p}/games"] == 1.0
    assert metrics["strategic/opening/all/games"] == 7.0
    # alliance: hold bots in all seven seats for two years: no support, no alliance, no change
    assert metrics["strategic/alliance/all/supports_given"] == 0.0
    assert metrics["strategic/alliance/all/alliances_formed"] == 0.0
    assert metrics["strategic/alliance/all/center_gain"] == 0.0
    assert "strategic/alliance/all/promise_kept_rate" not in metrics  # nobody promised


def test_greedy_self_play_gains_match_the_engine_played_directly():
    """The alliance dimension in self-play: greedy in all seven seats for two years gains what
    the same bots gain played straight on the engine."""
    sets = {"alliance": [standard_start(None, "alliance")]}
    agent = GameSpec(name="diplomacy").make_agent("greedy")
    metrics = evaluate_strategic(agent, sets, play_games, NO_PRESS, SamplingParams(), "greedy")
    auto = random.Random("0:auto")  # the game's retreats and builds: seeded by the state's seed
    *_, engine = play_springs({p: "greedy" for p in ROLES}, auto, 1903)
    for p in ROLES:
        gain = len(engine.get_centers(p)) - len(CENTERS[p])
        assert metrics[f"strategic/alliance/{p}/center_gain"] == gain
    assert metrics["strategic/alliance/all/supports_given"] == 0.0  # greedy never supports


def test_the_game_runs_it_only_when_asked():
    assert make_game("diplomacy").policy_metrics(HoldBot(), 0.0) == {}
    with pytest.raises(ValueError, match="play_games"):  # asked, but given no way to play
        make_game("diplomacy", strategic={"scenarios": 1}).policy_metrics(HoldBot(), 0.0)
    with pytest.raises(ValueError):
        make_game("diplomacy", strategic={"scenario": 2})  # misspelt


# ---- report and comparison ---------------------------------------------------------------------
def by_model() -> dict[str, dict[str, float]]:
    cell = {"center_gain": 0.5, "center_gain_se": 0.25, "games": 4.0}
    out = {}
    for model, shift in (("greedy", 0.0), ("x@champion", 1.0)):
        out[model] = {
            f"eval/strategic/{d}/{p}/{k}": v + (shift if k == "center_gain" else 0.0)
            for d in ("opening", "crisis")
            for p in (*ROLES, "all")
            for k, v in cell.items()
        }
    return out


def test_the_report_and_the_comparison_files(tmp_path):
    metrics = by_model()
    assert strategic_cells(metrics["greedy"])["crisis", "FRANCE", "center_gain"] == 0.5
    files = write_comparison(metrics, GameSpec(name="diplomacy"), tmp_path)
    table = files["strategic_table"].read_text()
    assert "| greedy | x@champion |" in table
    assert "| FRANCE | +0.50 ± 0.25 (4) | +1.50 ± 0.25 (4) |" in table
    assert "**crisis** (center_gain)" in table and "midgame" not in table
    assert files["strategic_heatmap"].read_bytes()[:4] == b"\x89PNG"
    assert label_of("models:/sparring@champion") == "sparring@champion"
    assert label_of("runs/exp/model") == "exp/model" and label_of("greedy") == "greedy"


def test_log_comparison_writes_one_mlflow_run_per_model(tmp_path, mlflow_db):
    tracking = TrackingConfig(tracking_uri=mlflow_db, experiment=uuid.uuid4().hex[:8])
    metrics = by_model()
    files = write_comparison(metrics, GameSpec(name="diplomacy"), tmp_path / "out")
    runs = log_comparison(
        metrics, ["greedy", "runs/x"], GameSpec(name="diplomacy"), files, tracking
    )
    from sparring.tracking import connect

    client = connect(tracking)
    run = client.get_run(runs["x@champion"])
    assert run.data.metrics["eval/strategic/crisis/FRANCE/center_gain"] == 1.5
    assert run.data.tags[MODEL_TAG] == "runs/x"
    assert {a.path for a in client.list_artifacts(run.info.run_id, "compare")} == {
        "compare/comparison.json",
        "compare/strategic_table.md",
        "compare/strategic_heatmap.png",
    }


def test_the_compare_command_plays_the_sets_for_each_model(tmp_path):
    """`sparring compare` end to end on the opening set (one scenario per country): the hold
    bot gains nothing (it never moves), and its table names it."""
    from click.testing import CliRunner

    from sparring.cli import main

    args = ["compare", "--game", "diplomacy", "--out", str(tmp_path), "--model", "hold"]
    args += ["--param", "press=false", "--param", "strategic.scenarios=1"]
    args += ["--param", "strategic.dimensions=[opening]", "--tracking-uri", ""]
    res = CliRunner().invoke(main, args, catch_exceptions=False)
    assert res.exit_code == 0, res.output
    metrics = json.loads((tmp_path / "comparison.json").read_text())["hold"]
    assert metrics["eval/strategic/opening/all/games"] == 7.0
    assert metrics["eval/strategic/opening/all/center_gain"] <= 0.0  # holding takes nothing
    assert "| hold |" in (tmp_path / "strategic_table.md").read_text()
