"""What each matching-game seat is told: the rules and its own table, as one system message."""

from __future__ import annotations

from typing import Any


def render_table(state: dict[str, Any], seat: int) -> str:
    """The seat's scaled view as an aligned text table; `?` marks a cell it cannot see."""
    view = state["views"][seat]
    first = max(6, max(len(r) for r in state["reviewers"]) + 1)
    width = max(len(p) for p in state["papers"]) + 1
    head = " " * first + "".join(p.rjust(width) for p in state["papers"])
    rows = [
        r.ljust(first) + "".join(("?" if v is None else str(v)).rjust(width) for v in view[i])
        for i, r in enumerate(state["reviewers"])
    ]
    return "\n".join([head, *rows])


def system_prompt(state: dict[str, Any], seat: int, mention_scale: bool = True) -> str:
    """The rules and the seat's table. `mention_scale` says the scores carry a private factor
    (dialop's LLM prompt does not say so)."""
    k = state["k"]
    scale = ", scaled by a private factor" if mention_scale else ""
    return (
        f"You and a partner assign {k} reviewers to {k} papers, one paper each, "
        f"to maximize the total score. You each see different scores{scale}; "
        "? means you cannot see it. Share what you know and agree on a plan.\n"
        "Your scores:\n" + render_table(state, seat) + "\n"
        "End each turn with one action line: [message] text, [propose] then one "
        "'reviewer: paper' line per reviewer, [accept], or [reject]. "
        "After you reject, it is still your turn."
    )
