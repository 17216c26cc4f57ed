"""Each power's alliance context, from what the powers did (seed 001's alliance-aware grouping).

    phases = last_year(engine)                      # the last two movement phases played
    allies(phases)["AUSTRIA"]                       # ["RUSSIA", "TURKEY"]
    alliance_label("AUSTRIA", ["RUSSIA", "TURKEY"]) # "AUSTRIA/eastern_alliance"

Two powers are **allied** over a span of movement phases when one helped the other and neither
attacked the other:
- *help*: a support (to hold or to move) or a convoy given to a unit of the other power;
- *attack*: a move into a province the other power holds (one of its units stands there, or it
  owns the supply center there) at the start of the phase, or a support or convoy of a move
  into such a province by a third power's unit.

Behaviour only. Press is free text (`[to GERMANY] text`, `orders.parse_press`) with no
structured declaration of an alliance, so what powers say is not read: a declared alliance
counts once the power acts on it. The relation is symmetric; labels are read from one power's
side (its allies need not be allied with one another).

The label names seed 001's blocs where they apply (`BLOCS`): the power and its allies are
exactly a bloc (`RUSSIA/eastern_alliance` when Russia's allies are Austria and Turkey), or a
power outside a bloc is allied with exactly its members (`ITALY/western_triple`). Otherwise
`<POWER>/with:<ALLY>,<ALLY>` (allies in `ROLES` order) or `<POWER>/isolated`.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from sparring.games.diplomacy.board import ROLES

BLOCS = {
    "western_triple": ("ENGLAND", "FRANCE", "GERMANY"),
    "eastern_alliance": ("AUSTRIA", "RUSSIA", "TURKEY"),
}
"""Seed 001's named alliances: the western triple and Austria allied with Russia and Turkey."""

ISOLATED = "isolated"


class PhaseOrders(NamedTuple):
    """One movement phase as the engine recorded it: every power's orders and the board they
    were given on."""

    orders: dict[str, list[str]]
    """Power -> its orders (`A VIE - GAL`, `F TRI S A VIE - GAL`, `F ENG C A LON - BRE`)."""
    units: dict[str, list[str]]
    """Power -> its units at the start of the phase (`A VIE`, `F STP/SC`)."""
    centers: dict[str, list[str]]
    """Power -> its supply centers at the start of the phase."""


def last_year(engine: Any) -> list[PhaseOrders]:
    """The last two movement phases in the engine's history (the last game year played since
    the engine's state was set; fewer, or none, early in an episode)."""
    moves = [h for h in engine.get_phase_history() if h.name.endswith("M")][-2:]
    return [
        PhaseOrders(
            {p: list(h.orders.get(p) or []) for p in ROLES},
            {p: list(h.state["units"].get(p, [])) for p in ROLES},
            {p: list(h.state["centers"].get(p, [])) for p in ROLES},
        )
        for h in moves
    ]


def _province(loc: str) -> str:
    """`STP/SC` -> `STP`; a dislodged unit's `*` mark is dropped too."""
    return loc.lstrip("*").split("/")[0]


def relations(phases: list[PhaseOrders]) -> tuple[set[frozenset[str]], set[frozenset[str]]]:
    """(pairs of powers where one helped the other, pairs where one attacked the other) over
    `phases` (see the module docstring)."""
    helped: set[frozenset[str]] = set()
    attacked: set[frozenset[str]] = set()
    for ph in phases:
        unit_owner = {_province(u.split()[1]): p for p, us in ph.units.items() for u in us}
        center_owner = {c: p for p, cs in ph.centers.items() for c in cs}
        holder = {**center_owner, **unit_owner}  # a unit standing there beats the owner
        for power, orders in ph.orders.items():
            for order in orders:
                words = order.split()
                if len(words) < 3:
                    continue
                if words[2] == "-":  # a move: an attack on whoever holds the destination
                    target = holder.get(_province(words[3]))
                    if target and target != power:
                        attacked.add(frozenset((power, target)))
                elif words[2] in ("S", "C") and len(words) >= 5:
                    owner = unit_owner.get(_province(words[4]))
                    if owner and owner != power:
                        helped.add(frozenset((power, owner)))
                    if len(words) >= 7 and words[5] == "-":  # help to a move: against its target
                        target = holder.get(_province(words[6]))
                        if target and target not in (power, owner):
                            attacked.add(frozenset((power, target)))
    return helped, attacked


def allies(phases: list[PhaseOrders]) -> dict[str, list[str]]:
    """Each power's allies over `phases` (in `ROLES` order): helped or was helped by it, and no
    attack either way."""
    helped, attacked = relations(phases)
    pairs = helped - attacked
    return {p: [q for q in ROLES if frozenset((p, q)) in pairs] for p in ROLES}


def alliance_label(power: str, its_allies: list[str]) -> str:
    """`<POWER>/<bloc>`, `<POWER>/with:<A>,<B>` or `<POWER>/isolated` (module docstring)."""
    if not its_allies:
        return f"{power}/{ISOLATED}"
    mine = set(its_allies)
    for name, members in BLOCS.items():
        if mine | {power} == set(members) or (power not in members and mine == set(members)):
            return f"{power}/{name}"
    return f"{power}/with:" + ",".join(q for q in ROLES if q in mine)


def alliance_context(engine: Any) -> dict[str, str]:
    """Every power's label over the last year the engine played (`isolated` for all before any
    movement phase has been played)."""
    found = allies(last_year(engine))
    return {p: alliance_label(p, found[p]) for p in ROLES}
