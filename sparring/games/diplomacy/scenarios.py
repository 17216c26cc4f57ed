"""Scenarios: seeded start positions from scripted play (1901 opening to endgame), and the
automatic retreat/adjustment orders used while generating and playing them."""

from __future__ import annotations

import random
from collections.abc import Iterator

from sparring.games.diplomacy.board import ROLES, Engine
from sparring.games.diplomacy.bots import (
    greedy_orders,
    hold_orders,
    possible_orders,
    random_orders,
    support_orders,
)

STAGES = {"opening": (1901, 1903), "midgame": (1904, 1908), "endgame": (1909, 1910)}
"""Stage -> (first, last) start year of its scenarios."""


def stage_of(year: int) -> str:
    """The scenario stage of a start year."""
    return "opening" if year <= 1903 else "midgame" if year <= 1908 else "endgame"


MAX_TRIES = 50
"""Scenario draws before `generate_state` gives up on its filters."""


def generate_state(
    seed: int,
    stages: list[str] | tuple[str, ...] = tuple(STAGES),
    max_start_centers: int | None = None,
    allow_eliminated: bool = True,
) -> dict:
    """A seeded, JSON-serialisable scenario; the same arguments always give the same state.

    Draw a stage and a start year in it, then play scripted bots (each power greedy or
    random-legal, drawn per power) from 1901 up to that year's spring movement phase. Redraw
    (from the same seeded stream) while a power holds more than `max_start_centers` centers
    or, unless `allow_eliminated`, a power is eliminated; `attempts` says how many draws it took.
    """
    rng = random.Random(seed)
    for attempt in range(1, MAX_TRIES + 1):
        state = _play_scenario(rng, stages)
        if state is None:  # a solo victory before the start year: no game left to play
            continue
        counts = [len(c) for c in state["centers"].values()]
        balanced = max_start_centers is None or max(counts) <= max_start_centers
        if balanced and (allow_eliminated or not state["eliminated"]):
            return {"seed": int(seed), "attempts": attempt, **state}
    raise ValueError(
        f"no scenario within {MAX_TRIES} draws for seed {seed} passes max_start_centers="
        f"{max_start_centers}, allow_eliminated={allow_eliminated}; relax the filters"
    )


def _play_scenario(rng: random.Random, stages: list[str] | tuple[str, ...]) -> dict | None:
    """One draw: a stage, a start year, bots per power, and the position they reach (None if
    the game ended first)."""
    stage = rng.choice(list(stages))
    year = rng.randint(*STAGES[stage])
    bots = {p: rng.choice(("greedy", "random-legal")) for p in ROLES}
    *_, engine = play_springs(bots, rng, year)
    return None if engine.is_game_done else position(engine, bots)


CHOOSERS = {
    "hold": hold_orders,
    "random-legal": random_orders,
    "greedy": greedy_orders,
    "support": support_orders,
}
"""Bot name -> its order chooser on a raw engine (`bots`)."""


def play_springs(bots: dict[str, str], rng: random.Random, last_year: int) -> Iterator[Engine]:
    """Play `bots` (power -> a `CHOOSERS` name) from the standard 1901 start, auto orders for
    retreats and builds; yield the engine (one object, played on after each yield) at every
    spring movement phase up to S<last_year>M, or until the game ends."""
    engine = Engine()
    while not engine.is_game_done:
        if engine.get_current_phase().startswith("S") and engine.phase_type == "M":
            yield engine
            if engine.get_current_phase() == f"S{last_year}M":
                return
        if engine.phase_type == "M":
            for power in ROLES:
                engine.set_orders(power, CHOOSERS[bots[power]](engine, power, rng))
        else:
            set_auto_orders(engine, rng)
        engine.process()


def position(engine: Engine, bots: dict[str, str]) -> dict:
    """The engine's position as a scenario (stage, year, phase, centers, eliminated powers, the
    bots that played to it and the engine's state)."""
    year = int(engine.get_current_phase()[1:5])
    return {
        "stage": stage_of(year),
        "year": year,
        "phase": engine.get_current_phase(),
        "scripted_by": bots,
        "centers": {p: sorted(engine.get_centers(p)) for p in ROLES},
        "eliminated": [p for p in ROLES if not engine.get_centers(p) and not engine.get_units(p)],
        "engine": {k: v for k, v in engine.get_state().items() if k != "timestamp"},
    }


def start_center_table(states: list[dict]) -> str:
    """The distribution of start centers per power over scenarios, as a markdown table
    (mean, min, max and the share of scenarios where the power starts eliminated)."""
    rows = ["| power | mean | min | max | eliminated |", "|---|---|---|---|---|"]
    for p in ROLES:
        n = [len(s["centers"][p]) for s in states]
        gone = sum(p in s.get("eliminated", []) for s in states) / len(states)
        rows.append(f"| {p} | {sum(n) / len(n):.1f} | {min(n)} | {max(n)} | {gone:.2f} |")
    return "\n".join(rows)


def auto_orders(engine: Engine, power: str, rng: random.Random) -> list[str]:
    """Default retreat/adjustment orders: a random legal retreat (else disband); builds in
    random free home centers up to the allowance. Disbands are left to the engine's civil
    disorder rule (it removes the units farthest from home)."""
    possible = {loc: sorted(orders) for loc, orders in possible_orders(engine).items()}
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
