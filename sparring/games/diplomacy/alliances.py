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

`conduct(moves_played(engine))` counts, per power over an episode, the alliances it formed in
the first year and kept after, the supports it gave and received, and the promises (its own
orders written in its press) it made and kept; every outcome carries it (`outcome["conduct"]`)
for the strategic evaluator's alliance dimension.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any, NamedTuple

from sparring.games.diplomacy.board import ROLES
from sparring.games.diplomacy.orders import normalize_order

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
    phase: str = ""
    """The phase's name (`S1902M`)."""
    press: tuple[tuple[str, str], ...] = ()
    """(sender, message) of the press sent during the phase."""


def moves_played(engine: Any) -> list[PhaseOrders]:
    """Every movement phase in the engine's history (since its state was set: an episode)."""
    return [
        PhaseOrders(
            {p: list(h.orders.get(p) or []) for p in ROLES},
            {p: list(h.state["units"].get(p, [])) for p in ROLES},
            {p: list(h.state["centers"].get(p, [])) for p in ROLES},
            h.name,
            tuple((m.sender, m.message) for m in h.messages.values()),
        )
        for h in engine.get_phase_history()
        if h.name.endswith("M")
    ]


def last_year(engine: Any) -> list[PhaseOrders]:
    """The last two movement phases in the engine's history (the last game year played since
    the engine's state was set; fewer, or none, early in an episode)."""
    return moves_played(engine)[-2:]


def _province(loc: str) -> str:
    """`STP/SC` -> `STP`; a dislodged unit's `*` mark is dropped too."""
    return loc.lstrip("*").split("/")[0]


def events(ph: PhaseOrders) -> Iterator[tuple[str, str, str]]:
    """("help", giver, receiver) and ("attack", attacker, attacked) for each order of one phase
    that helps or attacks another power (see the module docstring)."""
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
                    yield "attack", power, target
            elif words[2] in ("S", "C") and len(words) >= 5:
                owner = unit_owner.get(_province(words[4]))
                if owner and owner != power:
                    yield "help", power, owner
                if len(words) >= 7 and words[5] == "-":  # help to a move: against its target
                    target = holder.get(_province(words[6]))
                    if target and target not in (power, owner):
                        yield "attack", power, target


def relations(phases: list[PhaseOrders]) -> tuple[set[frozenset[str]], set[frozenset[str]]]:
    """(pairs of powers where one helped the other, pairs where one attacked the other) over
    `phases` (see the module docstring)."""
    found: dict[str, set[frozenset[str]]] = {"help": set(), "attack": set()}
    for ph in phases:
        for kind, a, b in events(ph):
            found[kind].add(frozenset((a, b)))
    return found["help"], found["attack"]


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


# ---- conduct: alliances kept, supports, promises (the strategic evaluator's alliance dimension) --
ORDER_RE = re.compile(
    r"\b[AF] [A-Z]{3}(?:/[A-Z]{2})?"  # the unit
    r"(?: H| - [A-Z]{3}(?:/[A-Z]{2})?| [SC] [AF] [A-Z]{3}(?:/[A-Z]{2})?(?: - [A-Z]{3}(?:/[A-Z]{2})?)?)"
    r"(?![A-Z/])"
)
"""An order in normalized text (`orders.normalize_order`): hold, move, support or convoy."""


def promises(ph: PhaseOrders) -> dict[str, tuple[int, int]]:
    """Per power, (promises made, promises kept) in one phase's press. A promise is an order for
    one of the sender's own units written in a message it sent (`A PAR - BUR`, `Army Paris to
    Burgundy`, `F BRE S A PAR - PIC`); it is kept when the sender's orders that phase include
    it (coasts aside). Each distinct order counts once per phase."""
    out = {}
    for power in ROLES:
        own = {_province(u.split()[1]) for u in ph.units.get(power, [])}
        said = {
            _coastless(o)
            for sender, text in ph.press
            if sender == power
            for o in ORDER_RE.findall(normalize_order(text))
            if _province(o.split()[1]) in own
        }
        given = {_coastless(o) for o in ph.orders.get(power, [])}
        out[power] = (len(said), len(said & given))
    return out


def _coastless(order: str) -> str:
    return re.sub(r"/[A-Z]{2}", "", order)


def conduct(phases: list[PhaseOrders]) -> dict[str, dict[str, int]]:
    """Per power, what it did toward the others over `phases` (an episode's movement phases):
    - `alliances_formed`: its allies (`allies`) over the first game year;
    - `alliances_kept`: those of them that neither attacked the other in a later year (with a
      one-year episode, every one formed);
    - `supports_given` / `supports_received`: helps (supports and convoys) it gave to other
      powers' units / other powers gave to its units, counted per order;
    - `promises` / `promises_kept` (`promises`, with press)."""
    years: dict[str, list[PhaseOrders]] = {}
    for ph in phases:
        years.setdefault(ph.phase[1:5], []).append(ph)
    first, *later = list(years.values()) or [[]]
    formed = allies(first)
    broken = relations([ph for year in later for ph in year])[1]
    out = {
        p: {
            "alliances_formed": len(formed[p]),
            "alliances_kept": sum(frozenset((p, q)) not in broken for q in formed[p]),
            "supports_given": 0,
            "supports_received": 0,
            "promises": 0,
            "promises_kept": 0,
        }
        for p in ROLES
    }
    for ph in phases:
        for kind, a, b in events(ph):
            if kind == "help":
                out[a]["supports_given"] += 1
                out[b]["supports_received"] += 1
        for p, (made, kept) in promises(ph).items():
            out[p]["promises"] += made
            out[p]["promises_kept"] += kept
    return out
