"""Scripted Diplomacy bots: `hold`, `random-legal`, `greedy` and `support`, and the press
teachers `greedy-press` and `support-press`.

Each bot writes one order per unit in movement phases; asked for retreats and builds
(`retreats: policy`) it gives the default `auto_orders`. The four bots send no press ("NONE").
The press teachers play as `greedy` and `support` do and, in the first press round of a phase,
tell each neighbour the orders they will give next to it (`announcement`): `[to FRANCE] A MUN -
BUR; A BER H`, promises they keep. They teach a model the press format (`warm_start.agent`);
no bot reads press, so against bots they score as their base bot. The order
choosers work on a raw engine (`diplomacy.Game`) so scenario generation can use them too:
- `hold_orders`: every unit holds.
- `random_orders`: a uniformly random legal order per unit (supports and convoys included).
- `greedy_orders`: each unit moves one step along a shortest path (for its unit type) toward
  the nearest supply center its power doesn't own; a unit already on such a center holds.
  Two units of one power never move to the same place.
- `support_orders`: coordinated, in the steps its body numbers: (1) units on centers their
  power is taking hold; (2) one neighbouring center it doesn't own at a time, a unit moves in
  and other units support that move, as many as the strongest other power could bring there
  (one more than that power's units on or next to the center), uncontested centers first and
  contested ones only with support; (3) in fall, units on the power's threatened centers hold
  and an empty threatened center gets a unit; (4) threatened holders get support holds from
  the units left; (5) the rest step as `greedy_orders` does. Ties break by the seeded rng. It
  takes defended centers that greedy bots bounce on.
"""

from __future__ import annotations

import random
from collections import Counter, defaultdict, deque
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sparring.games.diplomacy.game import DiplomacyGame

BOTS = ("hold", "random-legal", "greedy", "support")
"""The bots, weakest first (evaluation's `vs_scripted` plays each; `DiplomacyGame.agents`). The
press teachers are not among them: they play as their base bot."""
Engine = Any  # a diplomacy.Game (sparring.games.diplomacy.board imports the engine)
FAR = 10**6  # distance of an unreachable target
_DISTANCES: dict[tuple[str, str], dict[str, dict[str, int]]] = {}  # (map, unit type) -> table
_POSSIBLE: dict[tuple[int, str, int], dict[str, list[str]]] = {}  # see `possible_orders`


def possible_orders(engine: Engine) -> dict[str, list[str]]:
    """`engine.get_all_possible_orders()` (about 0.15 s a call), computed once per position:
    seven bots and the auto orders of one phase share it. Keyed by the engine, its phase and
    its position hash; the cache is emptied when it passes 256 positions."""
    key = (id(engine), engine.get_current_phase(), engine.get_hash())
    if key not in _POSSIBLE:
        if len(_POSSIBLE) >= 256:
            _POSSIBLE.clear()
        _POSSIBLE[key] = engine.get_all_possible_orders()
    return _POSSIBLE[key]


def hold_orders(engine: Engine, power: str, rng: random.Random | None = None) -> list[str]:
    """Every unit holds."""
    return [f"{unit} H" for unit in engine.get_units(power)]


def random_orders(engine: Engine, power: str, rng: random.Random) -> list[str]:
    """A random legal order for each orderable location."""
    possible = possible_orders(engine)
    locs = sorted(engine.get_orderable_locations(power))
    return [rng.choice(sorted(possible[loc])) for loc in locs if possible[loc]]  # engine: sets


def _distances(game_map: Any, unit_type: str) -> dict[str, dict[str, int]]:
    """Shortest-path steps for `unit_type` from every location to every supply center:
    {center: {location: steps}} (a location absent = unreachable). Cached per map."""
    key = (game_map.name, unit_type)
    if key not in _DISTANCES:
        _DISTANCES[key] = _bfs_from_centers(game_map, unit_type)
    return _DISTANCES[key]


def _bfs_from_centers(_map: Any, unit_type: str) -> dict[str, dict[str, int]]:
    locs = sorted({loc.upper() for loc in _map.locs})
    graph = {a: [b for b in locs if _map.abuts(unit_type, a, "-", b)] for a in locs}
    out = {}
    for center in _map.scs:
        dist = {loc: 0 for loc in locs if loc.split("/")[0] == center and graph[loc]}
        queue = deque(dist)
        while queue:
            here = queue.popleft()
            for there in graph[here]:  # abutment is symmetric on the standard map
                if there not in dist:
                    dist[there] = dist[here] + 1
                    queue.append(there)
        out[center] = dist
    return out


def _is_move(order: str) -> bool:
    """A plain move (not a support, convoy or convoyed move)."""
    return " - " in order and " S " not in order and " C " not in order and "VIA" not in order


def _moves(orders: Any) -> list[str]:
    """The plain moves among a location's legal orders."""
    return [o for o in orders if _is_move(o)]


def _loc(order: str) -> str:
    """The location of an order's (or a unit's) unit without its coast: `F STP/SC H` -> `STP`."""
    return order.split()[1].split("/")[0]


def _dest(order: str) -> str:
    """A move's destination without its coast: `F MAO - SPA/NC` -> `SPA`."""
    return order.split(" - ")[1].split("/")[0]


def _step_orders(
    engine: Engine, units: list[str], possible: dict, targets: list[str], claimed: set[str]
) -> list[str]:
    """Greedy steps for `units`: one step toward the nearest of `targets`, else hold; no
    two units move to (or hold in) one place (`claimed` grows with each order)."""
    orders = []
    for unit in sorted(units):
        kind, loc = unit.split()
        dist = _distances(engine.map, kind)

        def steps(place: str, dist: dict = dist) -> int:
            return min((dist[c].get(place, FAR) for c in targets), default=FAR)

        moves = [o for o in _moves(possible.get(loc.split("/")[0], [])) if _dest(o) not in claimed]
        best = min(moves, key=lambda o: (steps(o.split(" - ")[1]), o), default=None)
        if best is None or steps(best.split(" - ")[1]) >= steps(loc):
            orders.append(f"{unit} H")
            claimed.add(loc.split("/")[0])
        else:
            orders.append(best)
            claimed.add(_dest(best))
    return orders


def greedy_orders(engine: Engine, power: str, rng: random.Random | None = None) -> list[str]:
    """Step every unit toward the nearest supply center its power doesn't own."""
    targets = [c for c in engine.map.scs if c not in engine.get_centers(power)]
    possible = possible_orders(engine)
    return _step_orders(engine, engine.get_units(power), possible, targets, set())


def _pressure(engine: Engine, power: str, possible: dict) -> dict[str, int]:
    """Per location, the most units one other power has on it or one move from it: the
    strength that power could bring there (one unit moving or holding, the rest supporting)."""
    counts: dict[str, Counter[str]] = defaultdict(Counter)
    for other in sorted(engine.powers):
        if other == power:
            continue
        for unit in engine.get_units(other):
            loc = _loc(unit)
            for place in {loc, *map(_dest, _moves(possible.get(loc, [])))}:
                counts[place][other] += 1
    return {place: max(c.values()) for place, c in counts.items()}


def _supporters(order: str, free: list[str], units: dict, possible: dict, threat: dict) -> list:
    """Free units (locations) that can support `order` (a move, or a unit to hold), least
    threatened first (an attacked supporter's support is cut)."""
    able = [s for s in free if f"{units[s]} S {order}" in possible[s]]
    return sorted(able, key=lambda s: (threat.get(s, 0), s))


def _attack(
    targets: list[str],
    free: list[str],
    units: dict,
    possible: dict,
    threat: dict,
    rng: random.Random | None,
) -> tuple[str, list[str]] | None:
    """The best supported move into one of `targets` (centers the power doesn't own, not
    occupied by its own units): (move, supporter locations), or None. Strength wanted: one more
    than the most units one other power has on or next to the target. Attacks that reach it
    come first, cheapest first; then the strongest of the rest; an attack needs at least
    strength 2 when the target is contested at all."""
    best, best_key = None, None
    for loc in free:
        for move in sorted(_moves(possible[loc])):
            target = _dest(move)
            if target not in targets:
                continue
            need = threat.get(target, 0) + 1
            sups = _supporters(move, free, units, possible, threat)[: need - 1]
            if need > 1 and not sups:
                continue
            short = len(sups) + 1 < need
            key = (short, -len(sups) if short else len(sups), rng.random() if rng else 0.0, move)
            if best_key is None or key < best_key:
                best, best_key = (move, sups), key
    return best


def support_orders(engine: Engine, power: str, rng: random.Random | None = None) -> list[str]:
    """Coordinated orders (the module docstring lists the steps)."""
    possible = possible_orders(engine)
    owned = set(engine.get_centers(power))
    units = {_loc(u): u for u in engine.get_units(power)}
    threat = _pressure(engine, power, possible)
    # 1. units on centers their power is taking hold
    holders = [loc for loc in sorted(units) if loc in engine.map.scs and loc not in owned]
    orders = {loc: f"{units[loc]} H" for loc in holders}
    free = [loc for loc in sorted(units) if loc not in orders]
    # 2. supported attacks on neighbouring centers, one target at a time
    targets = [c for c in engine.map.scs if c not in owned and c not in units]
    while plan := _attack(targets, free, units, possible, threat, rng):
        move, sups = plan
        orders[_loc(move)] = move
        orders.update({s: f"{units[s]} S {move}" for s in sups})
        targets.remove(_dest(move))
        free = [loc for loc in free if loc not in orders]
    # 3. in fall, own centers a neighbour threatens: their units hold, empty ones get a unit
    if engine.get_current_phase().startswith("F"):
        for center in sorted(c for c in owned if threat.get(c, 0) > 0):
            if center in free:
                orders[center] = f"{units[center]} H"
                holders.append(center)
            elif center not in units:  # a unit from outside the power's centers steps in
                moves = (
                    m for loc in free if loc not in owned for m in sorted(_moves(possible[loc]))
                )
                if fill := next((m for m in moves if _dest(m) == center), None):
                    orders[_loc(fill)] = fill
            free = [loc for loc in free if loc not in orders]
    # 4. threatened holders get support holds from the units left
    for loc in sorted(holders, key=lambda h: (-threat.get(h, 0), h)):
        need = threat.get(loc, 0) - 1  # the holder wins ties
        sups = _supporters(units[loc], free, units, possible, threat)[: max(need, 0)]
        orders.update({s: f"{units[s]} S {units[loc]}" for s in sups})
        free = [f for f in free if f not in orders]
    # 5. the rest step greedily
    claimed = {_dest(o) if _is_move(o) else loc for loc, o in orders.items()}
    steps = _step_orders(engine, [units[f] for f in free], possible, targets, claimed)
    return [orders[loc] for loc in sorted(orders)] + steps


def _near(engine: Engine, loc: str) -> set[str]:
    """`loc`'s province and the provinces next to it, without coasts."""
    return {loc} | {a.split("/")[0].upper() for a in engine.map.abut_list(loc)}


def announcement(engine: Engine, power: str, orders: list[str], max_messages: int) -> list[str]:
    """`[to POWER] order; order` press lines: to each other power with a unit or supply
    center next to where one of `power`'s units stands or moves, the orders of those units;
    the `max_messages` powers with the most such units first (ties by name)."""
    near = {o: _near(engine, _loc(o)) | (_near(engine, _dest(o)) if _is_move(o) else set())
            for o in orders}  # fmt: skip
    told: dict[str, list[str]] = {}
    for other in sorted(engine.powers):
        if other == power:
            continue
        theirs = {_loc(u) for u in engine.get_units(other)} | set(engine.get_centers(other))
        if said := [o for o in orders if near[o] & theirs]:
            told[other] = said
    ranked = sorted(told, key=lambda p: (-len(told[p]), p))[:max_messages]
    return [f"[to {p}] {'; '.join(told[p])}" for p in ranked]


class _OrderBot:
    """Shared shell: in the orders stage, the chooser's orders one per line; no press, unless
    `announce`: then in a phase's first press round the orders it will give, to its neighbours
    (`announcement`), planned then and given unchanged in the orders round."""

    choose = staticmethod(hold_orders)
    announce = False

    def __init__(self, seed: int = 0) -> None:
        self.rng = random.Random(seed)
        self._planned: dict[tuple[int, str, int], list[str]] = {}  # (game, phase, seat)

    def act(self, game: DiplomacyGame, seat: int) -> str:
        power, key = game.roles[seat], (id(game), game.engine.get_current_phase(), seat)
        if game.action_kind == "press":
            if not self.announce or game.press_round > 1:
                return "NONE"
            planned = self._planned.setdefault(key, self.choose(game.engine, power, self.rng))
            lines = announcement(game.engine, power, planned, game.cfg.press_max_messages)
            return "\n".join(lines) or "NONE"
        if game.action_kind == "adjust":  # retreats and builds asked of the seat: the default
            from sparring.games.diplomacy.scenarios import auto_orders

            return "\n".join(auto_orders(game.engine, power, self.rng)) or "WAIVE"
        orders = self._planned.pop(key, None) or self.choose(game.engine, power, self.rng)
        return "\n".join(orders) or "NONE"


class HoldBot(_OrderBot):
    """Every unit holds."""


class RandomLegalBot(_OrderBot):
    """A random legal order per unit (seeded)."""

    choose = staticmethod(random_orders)


class GreedyBot(_OrderBot):
    """Move toward the nearest supply center the power doesn't own."""

    choose = staticmethod(greedy_orders)


class SupportBot(_OrderBot):
    """Supported attacks on neighbouring centers, support holds, greedy steps (seeded ties)."""

    choose = staticmethod(support_orders)


class GreedyPressBot(GreedyBot):
    """`greedy`, telling its neighbours its orders in the first press round."""

    announce = True


class SupportPressBot(SupportBot):
    """`support`, telling its neighbours its orders in the first press round."""

    announce = True
