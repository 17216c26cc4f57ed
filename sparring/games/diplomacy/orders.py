"""Parsing a power's text into engine orders and press messages."""

from __future__ import annotations

import re

from sparring.games.diplomacy.board import ABBREV

ORDER_START_RE = re.compile(r"^(?:A|F|ARMY|FLEET)\s+[A-Z]{3}\b")
BULLET_RE = re.compile(r"^\s*(?:[-*•]+|\d+[.)])\s*")
PRESS_RE = re.compile(r"^\s*(?:TO\s+)?([A-Za-z]+)\s*:\s*(.+?)\s*$", re.IGNORECASE)
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
}


def normalize_order(line: str) -> str:
    """Canonical engine spelling of one order line (it may still be illegal)."""
    text = BULLET_RE.sub("", line.upper()).replace("→", "-").replace("->", "-")
    text = re.sub(r"\s*-\s*", " - ", text).strip(" .;,")
    words = [WORDS.get(w, w) for w in text.split()]
    words = [w for w in words if w]
    if words and words[-1] == "H" and " S " in f" {' '.join(words)} ":
        words = words[:-1]  # "A PAR S A MAR H" = support to hold = "A PAR S A MAR"
    return " ".join(words)


def _strip_coasts(order: str) -> str:
    return re.sub(r"/[A-Z]{2}", "", order)


def parse_orders(
    text: str, possible: dict[str, list[str]], locs: list[str]
) -> tuple[dict[str, str], list[str]]:
    """Legal orders by location, and the invalid order lines, from a power's raw text.

    `possible` is the engine's legal orders per location; `locs` the power's orderable ones.
    The first legal order of a unit wins; a later one for the same unit is invalid.
    """
    orders: dict[str, str] = {}
    invalid: list[str] = []
    for line in text.splitlines():
        order = normalize_order(line)
        if not ORDER_START_RE.match(order):
            continue
        loc = order.split()[1].split("/")[0]
        legal = possible.get(loc, []) if loc in locs else []
        if order not in legal:  # allow a missing coast, or a convoyed move without VIA
            same = [
                o
                for o in legal
                if _strip_coasts(o) in (_strip_coasts(order), _strip_coasts(order) + " VIA")
            ]
            order = same[0] if len(same) == 1 else order
        if order in legal and loc not in orders:
            orders[loc] = order
        else:
            invalid.append(line.strip()[:80])
    return orders, invalid


def parse_press(text: str, sender: str, max_messages: int, max_chars: int) -> list[tuple[str, str]]:
    """(recipient, message) pairs from `POWER: message` / `ALL: message` lines."""
    sent: list[tuple[str, str]] = []
    for line in text.splitlines():
        m = PRESS_RE.match(line)
        if not m or len(sent) >= max_messages:
            continue
        name, body = m.group(1).upper(), m.group(2)[:max_chars]
        recipient = ABBREV.get(name[:3]) if name != "ALL" else "ALL"
        if recipient and recipient != sender and name in (recipient, recipient[:3], "ALL"):
            sent.append((recipient, body))
    return sent
