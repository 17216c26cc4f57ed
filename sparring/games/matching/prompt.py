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
    """The rules, the seat's table and a worked example of the protocol (with this game's
    names). `mention_scale` says the scores carry a private factor (dialop's LLM prompt does
    not say so)."""
    k, reviewers, papers = state["k"], state["reviewers"], state["papers"]
    scale = ", scaled by a private factor" if mention_scale else ""
    plan = "\n".join(f"{r}: {p}" for r, p in zip(reviewers, papers, strict=True))
    return (
        f"You and a partner assign {k} reviewers to {k} papers, one paper each, "
        f"to maximize the total score. You each see different scores{scale}; "
        "? means you cannot see it. Share what you know and agree on a plan.\n"
        "Your scores:\n" + render_table(state, seat) + "\n"
        "Each turn, write exactly one action line (you may think on lines before it):\n"
        "[message] text for your partner\n"
        "[propose] then one 'reviewer: paper' line per reviewer\n"
        "[accept] or [reject], to answer your partner's proposal "
        "(after you reject, it is still your turn)\n"
        "Examples:\n"
        f"[message] I see {reviewers[0]} {papers[0]} high. What are your best scores?\n"
        f"[propose]\n{plan}\n"
        "[accept]"
    )


def share_message(state: dict[str, Any], seat: int, limit: int | None = None) -> str:
    """`[message] Reviewer Paper value; ...`: the cells the seat sees, highest first (the first
    `limit` of them; all without one), in its own scale."""
    view, reviewers, papers = state["views"][seat], state["reviewers"], state["papers"]
    cells = sorted(
        ((v, r, p) for r, row in enumerate(view) for p, v in enumerate(row) if v is not None),
        reverse=True,
    )[:limit]
    if not cells:
        return "[message] I can't see any scores. What do you see?"
    return "[message] " + "; ".join(f"{reviewers[r]} {papers[p]} {int(v)}" for v, r, p in cells)
