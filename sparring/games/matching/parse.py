"""Parsing a matching-game turn: the action line and, for proposals, `reviewer: paper` lines.

The action is the last line that *opens* with a tag (after optional list markers or bold), as
dialop reads the tag at the start of a message; free reasoning may come before it, and a tag
inside prose ("I'd only [accept] if ...") is never an action. Everything here is linear in the
text length, and a turn longer than the game's `max_chars` is refused before parsing.
"""

from __future__ import annotations

import difflib
import re
from typing import Any

TAGS = ("message", "propose", "accept", "reject")
# An action line: optional markers ("- ", "> ", "1. ", "**"), then the tag. No nested
# quantifiers, so matching is linear.
ACTION_LINE_RE = re.compile(
    r"^[ \t>*\-\d.)]*\[(message|propose|accept|reject)\]\**[ \t]*", re.IGNORECASE
)
SEPARATORS = ("->", "=>", "→", ":", "=", " - ")
"""Between a reviewer and a paper in a proposal line; the first one found splits the line."""
MAX_NAME_CHARS = 40
"""Longer name candidates are not fuzzy-matched (difflib is quadratic in the length)."""
NAME_CUTOFF = 0.75  # difflib ratio needed to accept a misspelt name


def parse_action(
    text: str, reviewers: list[str], papers: list[str], max_chars: int | None = None
) -> tuple[dict[str, Any] | None, str | None]:
    """Parse raw model text into an action. Returns (action, None) or (partial, error)."""
    if max_chars is not None and len(text) > max_chars:
        return None, f"your turn is {len(text)} characters long; the limit is {max_chars}"
    lines = text.splitlines()
    found = None
    for i, line in enumerate(lines):
        m = ACTION_LINE_RE.match(line)
        if m:
            found = i, m
    if found is None:
        return None, "no action line; start a line with [message], [propose], [accept] or [reject]"
    i, m = found
    kind = m.group(1).lower()
    body = "\n".join([lines[i][m.end() :], *lines[i + 1 :]]).strip()
    if kind == "message":
        return ({"type": "message", "text": body}, None) if body else (None, "empty message")
    if kind in ("accept", "reject"):
        return {"type": kind}, None
    return parse_proposal(body, reviewers, papers)


def split_pair(chunk: str) -> tuple[str, str] | None:
    """(left, right) of one `reviewer: paper` chunk at its first separator, markers stripped."""
    chunk = chunk.strip().lstrip("-*•>0123456789.) \t").strip("*").strip()
    cuts = [(chunk.find(sep), sep) for sep in SEPARATORS if chunk.find(sep) > 0]
    if not cuts:
        return None
    at, sep = min(cuts)
    left, right = chunk[:at].strip(" *"), chunk[at + len(sep) :].strip(" *.;,")
    return (left, right) if left and right else None


def parse_proposal(
    body: str, reviewers: list[str], papers: list[str]
) -> tuple[dict[str, Any] | None, str | None]:
    """A full assignment from `reviewer: paper` lines (misspelt names within NAME_CUTOFF)."""
    k = len(reviewers)
    assignment: dict[str, str] = {}
    errors: list[str] = []
    for chunk in re.split(r"[\n;,]+", body):
        pair = split_pair(chunk)
        if pair is None:
            continue
        r, p = match_name(pair[0], reviewers), match_name(pair[1], papers)
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
    if len(key) > MAX_NAME_CHARS:
        return None
    close = difflib.get_close_matches(key, list(table), n=1, cutoff=NAME_CUTOFF)
    return table[close[0]] if close else None
