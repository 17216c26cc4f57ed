"""Scripted Diplomacy bots: `hold`, `random-legal` and `greedy`.

Each bot sends no press ("NONE") and writes one order per unit in movement phases; asked for
retreats and builds (`retreats: policy`) it gives the default `auto_orders`. The order
choosers work on a raw engine (`diplomacy.Game`) so scenario generation can use them too:
- `hold_orders`: every unit holds.
- `random_orders`: a uniformly random legal order per unit (supports and convoys included).
- `greedy_orders`: each unit moves one step along a shortest path (for its unit type) toward
  the nearest supply center its power doesn't own; a unit already on such a center holds.
  Two units of one power never move to the same place.
"""

from __future__ import annotations

import random
from collections import deque
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sparring.games.diplomacy.game import DiplomacyGame

BOTS = ("hold", "random-legal", "greedy")
"""The bots, weakest first (evaluation's `vs_scripted` plays each; `DiplomacyGame.agents`)."""
Engine = Any  # a diplomacy.Game (sparring.games.diplomacy.board imports the engine)
FAR = 10**6  # distance of an unreachable target
_DISTANCES: dict[tuple[str, str], dict[str, dict[str, int]]] = {}  # (map, unit type) -> table


def hold_orders(engine: Engine, power: str, rng: random.Random | None = None) -> list[str]:
    """Every unit holds."""
    return [f"{unit} H" for unit in engine.get_units(power)]


def random_orders(engine: Engine, power: str, rng: random.Random) -> list[str]:
    """A random legal order for each orderable location."""
    possible = engine.get_all_possible_orders()
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


def greedy_orders(engine: Engine, power: str, rng: random.Random | None = None) -> list[str]:
    """Step every unit toward the nearest supply center its power doesn't own."""
    possible = engine.get_all_possible_orders()
    targets = [c for c in engine.map.scs if c not in engine.get_centers(power)]
    claimed: set[str] = set()
    orders = []
    for unit in sorted(engine.get_units(power)):
        kind, loc = unit.split()
        dist = _distances(engine.map, kind)

        def steps(place: str, dist: dict = dist) -> int:
            return min((dist[c].get(place, FAR) for c in targets), default=FAR)

        moves = [
            o
            for o in possible.get(loc.split("/")[0], [])
            if o.count(" - ") == 1 and " S " not in o and " C " not in o and not o.endswith("VIA")
        ]
        moves = [o for o in moves if o.split(" - ")[1].split("/")[0] not in claimed]
        best = min(moves, key=lambda o: (steps(o.split(" - ")[1]), o), default=None)
        if best is None or steps(best.split(" - ")[1]) >= steps(loc):
            orders.append(f"{unit} H")
            claimed.add(loc.split("/")[0])
        else:
            orders.append(best)
            claimed.add(best.split(" - ")[1].split("/")[0])
    return orders


class _OrderBot:
    """Shared shell: no press; in the orders stage, the chooser's orders one per line."""

    choose = staticmethod(hold_orders)

    def __init__(self, seed: int = 0) -> None:
        self.rng = random.Random(seed)

    def act(self, game: DiplomacyGame, seat: int) -> str:
        if game.action_kind == "press":
            return "NONE"
        if game.action_kind == "adjust":  # retreats and builds asked of the seat: the default
            from sparring.games.diplomacy.scenarios import auto_orders

            return "\n".join(auto_orders(game.engine, game.roles[seat], self.rng)) or "WAIVE"
        return "\n".join(self.choose(game.engine, game.roles[seat], self.rng)) or "NONE"


class HoldBot(_OrderBot):
    """Every unit holds."""


class RandomLegalBot(_OrderBot):
    """A random legal order per unit (seeded)."""

    choose = staticmethod(random_orders)


class GreedyBot(_OrderBot):
    """Move toward the nearest supply center the power doesn't own."""

    choose = staticmethod(greedy_orders)
