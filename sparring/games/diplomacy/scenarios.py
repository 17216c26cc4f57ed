"""Scenarios: seeded start positions from scripted play (1901 opening to endgame), and the
automatic retreat/adjustment orders used while generating and playing them."""

from __future__ import annotations

import random

from sparring.games.diplomacy.board import ROLES, Engine
from sparring.games.diplomacy.bots import greedy_orders, random_orders

STAGES = {"opening": (1901, 1903), "midgame": (1904, 1908), "endgame": (1909, 1910)}
"""Stage -> (first, last) start year of its scenarios."""


def stage_of(year: int) -> str:
    """The scenario stage of a start year."""
    return "opening" if year <= 1903 else "midgame" if year <= 1908 else "endgame"


def generate_state(seed: int, stages: list[str] | tuple[str, ...] = tuple(STAGES)) -> dict:
    """A seeded, JSON-serialisable scenario; the same arguments always give the same state.

    Draw a stage and a start year in it, then play scripted bots (each power greedy or
    random-legal, drawn per power) from 1901 up to that year's spring movement phase.
    """
    rng = random.Random(seed)
    stage = rng.choice(list(stages))
    year = rng.randint(*STAGES[stage])
    bots = {p: rng.choice(("greedy", "random-legal")) for p in ROLES}
    engine = Engine()
    while engine.get_current_phase() != f"S{year}M" and not engine.is_game_done:
        if engine.phase_type == "M":
            for power in ROLES:
                choose = greedy_orders if bots[power] == "greedy" else random_orders
                engine.set_orders(power, choose(engine, power, rng))
        else:
            set_auto_orders(engine, rng)
        engine.process()
    return {
        "seed": int(seed),
        "stage": stage_of(int(engine.get_current_phase()[1:5])),
        "year": int(engine.get_current_phase()[1:5]),
        "phase": engine.get_current_phase(),
        "scripted_by": bots,
        "centers": {p: sorted(engine.get_centers(p)) for p in ROLES},
        "engine": {k: v for k, v in engine.get_state().items() if k != "timestamp"},
    }


def auto_orders(engine: Engine, power: str, rng: random.Random) -> list[str]:
    """Default retreat/adjustment orders: a random legal retreat (else disband); builds in
    random free home centers up to the allowance. Disbands are left to the engine's civil
    disorder rule (it removes the units farthest from home)."""
    possible = {loc: sorted(orders) for loc, orders in engine.get_all_possible_orders().items()}
    locs = sorted(engine.get_orderable_locations(power))  # sorted: the engine's are set-ordered
    if engine.phase_type == "R":
        return [
            rng.choice([o for o in possible[loc] if " R " in o] or possible[loc]) for loc in locs
        ]
    allowance = len(engine.get_centers(power)) - len(engine.get_units(power))
    rng.shuffle(locs)
    builds = [[o for o in possible[loc] if o.endswith(" B")] for loc in locs]
    return [rng.choice(b) for b in builds if b][: max(allowance, 0)]


def set_auto_orders(engine: Engine, rng: random.Random) -> None:
    """Give every power its `auto_orders` for the current retreat/adjustment phase."""
    for power in ROLES:
        if engine.get_orderable_locations(power):
            engine.set_orders(power, auto_orders(engine, power, rng))
