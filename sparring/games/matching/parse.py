"""Parsing a matching-game turn: the action tag and, for proposals, `reviewer: paper` lines."""

from __future__ import annotations

import difflib
import re
from typing import Any

TAG_RE = re.compile(r"\[(message|propose|accept|reject)\]", re.IGNORECASE)
PAIR_RE = re.compile(r"^\s*[-*\d.)]*\s*(.+?)\s*(?::|->|=>|→|=|\s-\s)\s*(.+?)\s*[.;,]?\s*$")
NAME_CUTOFF = 0.75  # difflib ratio needed to accept a misspelt name


def parse_action(
    text: str, reviewers: list[str], papers: list[str]
) -> tuple[dict[str, Any] | None, str | None]:
    """Parse raw model text into an action. Returns (action, None) or (partial, error)."""
    tags = list(TAG_RE.finditer(text))
    if not tags:
        return None, "no action tag; use [message], [propose], [accept] or [reject]"
    last = tags[-1]
    kind, body = last.group(1).lower(), text[last.end() :].strip()
    if kind == "message":
        return ({"type": "message", "text": body}, None) if body else (None, "empty message")
    if kind in ("accept", "reject"):
        return {"type": kind}, None
    return parse_proposal(body, reviewers, papers)


def parse_proposal(
    body: str, reviewers: list[str], papers: list[str]
) -> tuple[dict[str, Any] | None, str | None]:
    """A full assignment from `reviewer: paper` lines (misspelt names within NAME_CUTOFF)."""
    k = len(reviewers)
    assignment: dict[str, str] = {}
    errors: list[str] = []
    for chunk in re.split(r"[\n;,]+", body):
        m = PAIR_RE.match(chunk)
        if not chunk.strip() or not m:
            continue
        r, p = match_name(m.group(1), reviewers), match_name(m.group(2), papers)
        if r is None or p is None:
            errors.append(f"unknown name in {chunk.strip()[:40]!r}")
        elif r in assignment:
            errors.append(f"reviewer {r} assigned twice")
        else:
            assignment[r] = p
    if errors:
        return None, "; ".join(errors[:3])
    if len(set(assignment.values())) != len(assignment):
        return None, "a paper is assigned to two reviewers"
    if len(assignment) != k:
        return (
            None,
            f"a proposal needs exactly {k} 'reviewer: paper' lines, got {len(assignment)}",
        )
    return {"type": "propose", "assignment": assignment}, None


def match_name(raw: str, names: list[str]) -> str | None:
    """Exact (case-insensitive) match, else the closest name above NAME_CUTOFF."""
    key = re.sub(r"[^a-z0-9]", "", raw.lower())
    table = {re.sub(r"[^a-z0-9]", "", n.lower()): n for n in names}
    if key in table:
        return table[key]
    close = difflib.get_close_matches(key, list(table), n=1, cutoff=NAME_CUTOFF)
    return table[close[0]] if close else None
