"""The `support` bot: legal orders, a supported capture where a lone attack bounces, seeding;
and its bench at smoke size."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("diplomacy")

from sparring.games.diplomacy import ROLES, DiplomacyGame  # noqa: E402
from sparring.games.diplomacy.board import Engine  # noqa: E402
from sparring.games.diplomacy.bots import support_orders  # noqa: E402
from sparring.games.diplomacy.scenarios import generate_state  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]


def engine_at(state: dict) -> Engine:
    engine = Engine()
    engine.set_state(state["engine"])
    return engine


def assert_legal(engine: Engine, power: str, orders: list[str]) -> None:
    """One legal order per unit."""
    possible = engine.get_all_possible_orders()
    assert all(o in possible[o.split()[1].split("/")[0]] for o in orders), orders
    assert sorted(o.split()[1] for o in orders) == sorted(
        u.split()[1] for u in engine.get_units(power)
    )


@pytest.fixture(scope="module")
def midgame() -> Engine:
    """A mid-game spring reached by scripted play."""
    return engine_at(generate_state(5, stages=["midgame"]))


@pytest.mark.parametrize("position", ["opening", "midgame"])
def test_orders_are_legal_for_every_power(position, request):
    engine = Engine() if position == "opening" else request.getfixturevalue("midgame")
    for power in ROLES:
        assert_legal(engine, power, support_orders(engine, power, random.Random(0)))


def munich_position() -> Engine:
    """Fall 1901: France's armies in Burgundy and the Ruhr next to a German army in Munich
    (France owns every other center they touch, so Munich is their one target)."""
    engine = Engine()
    for power in ROLES:
        engine.set_units(power, [], reset=True)
        engine.set_centers(power, [], reset=True)
    engine.set_current_phase("F1901M")
    engine.set_units("FRANCE", ["A BUR", "A RUH"], reset=True)
    engine.set_centers("FRANCE", ["PAR", "MAR", "BEL", "HOL", "KIE"], reset=True)
    engine.set_units("GERMANY", ["A MUN"], reset=True)
    engine.set_centers("GERMANY", ["MUN"], reset=True)
    return engine


def munich_owner(france: list[str]) -> str:
    """Who owns Munich after France's orders against a German hold, once the fall is over."""
    engine = munich_position()
    engine.set_orders("FRANCE", france)
    engine.set_orders("GERMANY", ["A MUN H"])
    while engine.phase_type != "A":  # the fall's moves, then its retreats (a dislodged unit)
        engine.process()
    return next(p for p in ROLES if "MUN" in engine.get_centers(p))


def test_a_supported_attack_takes_the_center_a_lone_attack_bounces_on():
    assert munich_owner(["A BUR - MUN", "A RUH H"]) == "GERMANY"  # 1 against 1: a bounce
    orders = support_orders(munich_position(), "FRANCE", random.Random(0))
    move = next(o for o in orders if o.endswith(" - MUN") and " S " not in o)
    assert sorted(orders) == sorted([move, f"{'A RUH' if 'BUR' in move else 'A BUR'} S {move}"])
    assert munich_owner(orders) == "FRANCE"


def test_seeded_orders_repeat_and_the_bot_plays_a_game(midgame):
    for power in ROLES:
        first = support_orders(midgame, power, random.Random(3))
        assert support_orders(midgame, power, random.Random(3)) == first
    game = DiplomacyGame(press=False)
    game.reset(game.generate_state(1))
    bots = [DiplomacyGame.make_agent("support", seed=seat) for seat in range(7)]
    while not game.done:
        for seat in list(game.pending_seats):
            assert game.step(seat, bots[seat].act(game, seat)).ok
    assert sum(s.invalid_orders for s in game.power_stats) == 0


def test_bench_prints_the_gain_and_its_standard_error_last():
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "diplomacy_bots.py"), "--states", "1"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout.splitlines()
    names = [line.split()[1] for line in out[-2:]]
    assert names == ["support_bot_gain_over_greedy", "support_bot_gain_over_greedy_se"]


@pytest.mark.parametrize("teacher,base", [("greedy-press", "greedy"), ("support-press", "support")])
def test_press_teachers_tell_neighbours_the_orders_they_then_give(teacher, base):
    """A game of press teachers in all seven seats: each power's first press round holds
    `[to POWER]` lines the game accepts, to powers with a unit or center next to the units
    named, naming its own units' orders; the second round is NONE; the orders round gives
    exactly the orders announced (every promise kept) and the base bot's orders, so the board
    ends as the base bots' game does."""

    def play(name: str) -> tuple[DiplomacyGame, list]:
        game = DiplomacyGame(horizon=1, press=True, stages=["opening"])
        game.reset(game.generate_state(3))
        bots = [DiplomacyGame.make_agent(name, seed=seat) for seat in range(7)]
        said = []
        while not game.done:
            for seat in list(game.pending_seats):
                text = bots[seat].act(game, seat)
                said.append((game.action_kind, game.press_round, seat, text))
                assert game.step(seat, text).ok
        return game, said

    game, said = play(teacher)
    plain, _ = play(base)
    assert game.results() == plain.results()
    first = [(seat, text) for kind, rnd, seat, text in said if kind == "press" and rnd == 1]
    assert [text for kind, rnd, _, text in said if kind == "press" and rnd > 1] == ["NONE"] * 14
    orders = [(seat, text) for kind, _, seat, text in said if kind == "orders"]
    assert len(first) == len(orders) == 14  # 7 powers x 2 movement phases
    for (seat, text), (_, given) in zip(first, orders, strict=True):
        lines = text.splitlines()
        assert 1 <= len(lines) <= 3 and all(line.startswith("[to ") for line in lines), text
        for line in lines:
            recipient, body = line[4:].split("] ", 1)
            assert recipient in ROLES and recipient != ROLES[seat]
            assert set(body.split("; ")) <= set(given.splitlines())
    conduct = game.outcome()["conduct"]  # what the strategic evaluator counts
    for power in ROLES:
        assert conduct[power]["promises"] == conduct[power]["promises_kept"] > 0
    assert sum(s.press_sent for s in game.power_stats) >= 14


def test_a_press_teacher_tells_only_its_neighbours():
    """In the opening France's units border England, Germany and Italy's units or centers (not
    Russia, Turkey or Austria): its announcement goes to those, its army in Marseilles' order
    to Italy (Piedmont) and its fleet in Brest's to England (Channel)."""
    from sparring.games.diplomacy.bots import announcement

    engine = Engine()
    orders = ["F BRE - MAO", "A MAR - PIE", "A PAR - BUR"]
    lines = announcement(engine, "FRANCE", orders, 3)
    told = {line[4:].split("]")[0]: line.split("] ")[1].split("; ") for line in lines}
    assert set(told) <= {"ENGLAND", "GERMANY", "ITALY"} and "ITALY" in told
    assert "A MAR - PIE" in told["ITALY"] and "A PAR - BUR" in told["GERMANY"]
    assert len(announcement(engine, "FRANCE", orders, 1)) == 1
