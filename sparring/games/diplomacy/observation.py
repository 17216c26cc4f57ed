"""What a Diplomacy power sees: the board (the same text for all seven powers, first, so their
prompts share a prefix) and then its own units with their options. With `recap: years`
a fresh chat recaps the episode instead of keeping it: `center_history` (one line per finished
year) before the board, `press_digest` (the power's last messages) before its units.

    Spring 1902, year 2 of 2.
    Centers: AUS BUD SER TRI VIE | ENG EDI LON LVP NWY | ... | unowned: BEL DEN HOL
    Units: AUS A BUD, A SER, F ALB, A VIE; ENG ...
    Last orders (F1901M): AUS A BUD - SER, F TRI - ALB, A VIE - GAL (bounce); ENG ...
    You are FRANCE: 5 centers, 4 units.
    Your units and options (moves; S = supports, C = convoys):
    A PAR -> BUR GAS PIC | S into BUR GAS PIC | S hold BRE MAR
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from sparring.games.diplomacy.board import ROLES

SEASONS = {"S": "Spring", "F": "Fall", "W": "Winter"}


def board_view(engine: Any, year_index: int, horizon: int) -> str:
    """Phase, center owners, unowned centers, units and the last movement phase's orders with
    their results: identical for every power."""
    phase = engine.get_current_phase()
    owned = {c for p in ROLES for c in engine.get_centers(p)}
    unowned = sorted(set(engine.map.scs) - owned)
    centers = " | ".join(
        f"{p[:3]} {' '.join(sorted(engine.get_centers(p)))}" for p in ROLES if engine.get_centers(p)
    )
    units = "; ".join(
        f"{p[:3]} {', '.join(engine.get_units(p))}" for p in ROLES if engine.get_units(p)
    )
    lines = [
        f"{SEASONS[phase[0]]} {phase[1:5]}, year {year_index} of {horizon}.",
        f"Centers: {centers} | unowned: {' '.join(unowned) or 'none'}",
        f"Units: {units}",
    ]
    last = last_orders(engine)
    if last:
        lines.append(last)
    return "\n".join(lines)


def last_orders(engine: Any) -> str | None:
    """Every power's orders of the last movement phase, with non-success results."""
    moves = [h for h in engine.get_phase_history() if h.name.endswith("M")]
    if not moves:
        return None
    h = moves[-1]
    parts = []
    for power in ROLES:
        shown = []
        for order in h.orders.get(power) or []:
            unit = " ".join(order.split()[:2])
            results = [str(r) for r in h.results.get(unit, []) if str(r) != "void"]
            shown.append(order + (f" ({', '.join(results)})" if results else ""))
        if shown:
            parts.append(f"{power[:3]} {', '.join(shown)}")
    return f"Last orders ({h.name}): " + "; ".join(parts) if parts else None


def center_history(engine: Any, start_year: int) -> list[str]:
    """Each finished year of the episode as one line: every power's centers with the change
    (what a fresh chat, `recap: years`, keeps of the phases before the last)."""
    history = engine.get_phase_history()
    springs = [h.state["centers"] for h in history if h.name[0] == "S" and h.name[-1] == "M"]
    if engine.get_current_phase()[0] == "S":  # a year just ended
        springs.append({p: engine.get_centers(p) for p in ROLES})
    lines = []
    for year, (before, after) in enumerate(zip(springs, springs[1:], strict=False), start_year):
        counts = [(p[:3], len(after.get(p, [])), len(before.get(p, []))) for p in ROLES]
        changes = (f"{p} {n}" + (f" ({n - m:+d})" if n != m else "") for p, n, m in counts)
        lines.append(f"Centers after {year}: " + ", ".join(changes))
    return lines


def press_digest(engine: Any, power: str, last: int) -> list[str]:
    """The last `last` press messages `power` sent or received in the episode, oldest first."""
    messages = [m for h in engine.get_phase_history() for m in h.messages.values()]
    messages += engine.messages.values()
    mine = [m for m in messages if power in (m.sender, m.recipient) or m.recipient == "GLOBAL"]
    if not last or not mine:
        return []
    shown = [
        f"{m.phase} {m.sender} "
        + ("to all" if m.recipient == "GLOBAL" else f"to {m.recipient}")
        + f": {m.message}"
        for m in mine[-last:]
    ]
    return [f"Earlier press (the last {len(shown)}):", *shown]


def power_view(engine: Any, power: str, possible: dict[str, list[str]], mode: str) -> str:
    """The power's own part: its counts and each unit's options (`compact`: moves, supports and
    convoys grouped; `full`: every legal order)."""
    n_centers, n_units = len(engine.get_centers(power)), len(engine.get_units(power))
    lines = [f"You are {power}: {n_centers} centers, {n_units} units."]
    if not engine.get_orderable_locations(power):
        return "\n".join([*lines, "You have no units to order."])
    lines.append(
        "Your units and options (-> moves; S into: support a move there; S hold: support the "
        "unit there; C: convoy):"
        if mode == "compact"
        else "Your units and legal orders:"
    )
    for unit in engine.get_units(power):
        legal = possible.get(unit.split()[1].split("/")[0], [])
        lines.append(
            f"{unit}: " + " | ".join(sorted(legal))
            if mode == "full"
            else compact_options(unit, legal)
        )
    return "\n".join(lines)


def compact_options(unit: str, legal: list[str]) -> str:
    """`A MAR -> BUR GAS PIE SPA | S into BUR GAS | S hold PAR | C A LON -> BRE`: one unit's
    legal orders grouped: move destinations, where it can support a move into, which units
    it can support to hold (by place), and the armies it can convoy with their destinations."""
    moves: set[str] = set()
    into: set[str] = set()
    hold: set[str] = set()
    convoys: dict[str, set[str]] = defaultdict(set)
    for order in legal:
        words = order.split()
        if len(words) > 6 and words[2] == "S":
            into.add(words[6].split("/")[0])
        elif len(words) == 5 and words[2] == "S":
            hold.add(words[4].split("/")[0])
        elif len(words) > 6 and words[2] == "C":
            convoys[" ".join(words[3:5])].add(words[6])
        elif len(words) == 4 and words[2] == "-":
            moves.add(words[3])
    parts = [f"{unit} -> {' '.join(sorted(moves)) or '(hold only)'}"]
    parts += [
        f"{tag} {' '.join(sorted(v))}" for tag, v in (("S into", into), ("S hold", hold)) if v
    ]
    parts += [f"C {army} -> {' '.join(sorted(d))}" for army, d in sorted(convoys.items())]
    return " | ".join(parts)


def adjust_prompt(engine: Any, power: str, possible: dict[str, list[str]]) -> str:
    """Retreats or builds asked of the policy (`retreats: policy`), with the legal options."""
    phase = engine.get_current_phase()
    locs = sorted(engine.get_orderable_locations(power))
    if engine.phase_type == "R":
        head = f"{phase}: retreat or disband your dislodged units. Legal orders:"
        options = [f"{loc}: " + " | ".join(sorted(possible.get(loc, []))) for loc in locs]
    else:
        allowance = len(engine.get_centers(power)) - len(engine.get_units(power))
        verb = f"build up to {allowance}" if allowance > 0 else f"disband {-allowance}"
        head = f"{phase}: you may {verb} unit(s). Legal orders (or WAIVE):"
        options = [" | ".join(sorted({o for loc in locs for o in possible.get(loc, [])}))]
    return "\n".join([head, *options, "Orders, one per line:"])
