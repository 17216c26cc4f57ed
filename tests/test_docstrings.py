"""Module docstrings are usage text (a bench's `--help`, `help(module)`): they keep their lines."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def docstring_node(path: Path) -> ast.Constant | None:
    body = ast.parse(path.read_text()).body
    node = getattr(body[0], "value", None) if body else None
    return node if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def test_docstrings_keep_their_line_breaks():
    """A command continued with a single `\\` at the end of a docstring line loses that line
    break: it prints as one line with a gap in it."""
    paths = [p for d in ("bench", "sparring") for p in (ROOT / d).rglob("*.py")]
    nodes = {p: docstring_node(p) for p in paths}
    assert sum(n is not None for n in nodes.values()) > 50
    joined = [
        str(p.relative_to(ROOT))
        for p, n in nodes.items()
        if n is not None and n.value.count("\n") != n.end_lineno - n.lineno
    ]
    assert joined == []
