"""Parsing a power's text into engine orders and press messages.

Orders are read the way models write them (AI_Diplomacy-style JSON lists, full province names,
dashes and arrows, several orders on one comma-separated line, markdown bold and list
markers, trailing comments). A candidate that does not start with a unit (`A PAR`, `Army
Paris`) is free text: neither counted nor penalised. A candidate naming a location where the
power can give an order, that is not a legal order there, is invalid, with a reason.

Press is explicit: a line `[to GERMANY] text` or `[to ALL] text`; any other line is private
reasoning and is never sent.
"""

from __future__ import annotations

import json
import re
from functools import cache
from typing import NamedTuple

from sparring.games.diplomacy.board import ABBREV, Engine

ORDER_START_RE = re.compile(r"^(?:A|F)\s+[A-Z]{3}\b")
MARKUP_RE = re.compile(r"\*\*|__|`")
BULLET_RE = re.compile(r"^\s*(?:[-*•>]+|\d+[.)])\s*")
COMMENT_RE = re.compile(r"\s*(?:#|//|\(|--\s).*$")
ARROWS_RE = re.compile(r"\s*(?:->|=>|→|⇒|–|—|-)\s*")
PRESS_RE = re.compile(r"^[ \t>*\-]*\[\s*to\s+([A-Za-z]+)\s*\]\**[ \t]*(.*)$", re.IGNORECASE)
WORDS = {
    "ARMY": "A",
    "FLEET": "F",
    "HOLDS": "H",
    "HOLD": "H",
    "SUPPORTS": "S",
    "SUPPORT": "S",
    "CONVOYS": "C",
    "CONVOY": "C",
    "TO": "-",
    "MOVES": "",
    "MOVE": "",
    "RETREATS": "R",
    "RETREAT": "R",
    "DISBANDS": "D",
    "DISBAND": "D",
    "BUILDS": "B",
    "BUILD": "B",
}


class ParsedOrders(NamedTuple):
    """One power's parsed orders."""

    orders: dict[str, str]
    """Location -> its legal engine order (the first legal order of a unit wins)."""
    invalid: list[tuple[str, str]]
    """(the written candidate, why it is invalid) for candidates naming an orderable location."""
    waive: int
    """WAIVE orders given (builds given up)."""


@cache
def province_names() -> tuple[tuple[re.Pattern[str], str], ...]:
    """(full name pattern, abbreviation), longest names first: "BURGUNDY" -> BUR."""
    names: dict[str, str] = {}
    for name, abbr in Engine().map.loc_name.items():
        if "(" in name or len(name) <= 3:
            continue
        names[name] = abbr.upper()
        names[name.replace("ST ", "ST. ")] = abbr.upper()
        names[name.replace("ST ", "SAINT ")] = abbr.upper()
    return tuple(
        (re.compile(rf"\b{re.escape(n)}\b"), a)
        for n, a in sorted(names.items(), key=lambda kv: -len(kv[0]))
    )


def candidates(text: str) -> list[str]:
    """The order candidates of a text: the strings of a JSON list (or of an object's `orders`
    list) if the text holds one, else its lines split on commas, markup and comments removed."""
    found = _json_orders(text)
    if found is None:
        found = [part for line in text.splitlines() for part in re.split(r"[,;]", _clean(line))]
    return [c.strip() for c in found if c.strip()]


def _json_orders(text: str) -> list[str] | None:
    start, end = text.find("["), text.rfind("]")
    brace, close = text.find("{"), text.rfind("}")
    for a, b in ((brace, close), (start, end)):
        if 0 <= a < b:
            try:
                value = json.loads(text[a : b + 1])
            except ValueError:
                continue
            if isinstance(value, dict):
                value = value.get("orders", value.get("ORDERS"))
            if isinstance(value, list) and all(isinstance(v, str) for v in value):
                return value
    return None


def _clean(line: str) -> str:
    line = BULLET_RE.sub("", MARKUP_RE.sub("", line))
    return COMMENT_RE.sub("", line)


def normalize_order(text: str) -> str:
    """Canonical engine spelling of one order (it may still be illegal)."""
    text = BULLET_RE.sub("", MARKUP_RE.sub("", text.upper()))
    for pattern, abbr in province_names():
        text = pattern.sub(abbr, text)
    text = ARROWS_RE.sub(" - ", text).strip(" .;,:")
    words = [WORDS.get(w, w) for w in text.split()]
    words = [w for w in words if w]
    if words and words[-1] == "H" and " S " in f" {' '.join(words)} ":
        words = words[:-1]  # "A PAR S A MAR H" = support to hold = "A PAR S A MAR"
    return " ".join(words)


def _strip_coasts(order: str) -> str:
    return re.sub(r"/[A-Z]{2}", "", order)


def parse_orders(text: str, possible: dict[str, list[str]], locs: list[str]) -> ParsedOrders:
    """Legal orders by location and the invalid candidates (with reasons) of a power's text.

    `possible` is the engine's legal orders per location; `locs` the power's orderable ones.
    """
    orders: dict[str, str] = {}
    invalid: list[tuple[str, str]] = []
    waive = 0
    for raw in candidates(text):
        order = normalize_order(raw)
        if order == "WAIVE":
            waive += 1
            continue
        if not ORDER_START_RE.match(order):
            continue  # free text
        loc = order.split()[1].split("/")[0]
        if loc not in locs:
            continue  # not one of this power's units: free text (e.g. another power's move)
        legal = possible.get(loc, [])
        if order not in legal:  # allow a missing coast, or a convoyed move without VIA
            same = [
                o
                for o in legal
                if _strip_coasts(o) in (_strip_coasts(order), _strip_coasts(order) + " VIA")
            ]
            order = same[0] if len(same) == 1 else order
        if loc in orders:
            invalid.append((raw[:80], f"{loc} already has an order"))
        elif order in legal:
            orders[loc] = order
        else:
            invalid.append((raw[:80], f"not a legal order for your unit in {loc}"))
    return ParsedOrders(orders, invalid, waive)


def parse_press(text: str, sender: str, max_messages: int, max_chars: int) -> list[tuple[str, str]]:
    """(recipient, message) pairs from `[to POWER] message` / `[to ALL] message` lines."""
    sent: list[tuple[str, str]] = []
    for line in text.splitlines():
        m = PRESS_RE.match(line)
        if not m or not m.group(2).strip() or len(sent) >= max_messages:
            continue
        name, body = m.group(1).upper(), m.group(2).strip()[:max_chars]
        recipient = "ALL" if name == "ALL" else ABBREV.get(name[:3])
        if recipient and recipient != sender and name in (recipient, recipient[:3], "ALL"):
            sent.append((recipient, body))
    return sent
