"""The Game seam holds: no generic module (everything under sparring/ outside sparring/games/)
names a game in its code, or reads a key that a game declares. Comments and docstrings may
name a game; a name, string or attribute may not.

"A game" is every registered game's name, its package and class, its scripted agents (those
named by more than one word: Diplomacy's `hold` and `greedy` are also ordinary words) and its
own group keys (and their deprecated aliases), plus the fixed words below. Names compare as
sequences of words, split at `-`, `_`, spaces and camelCase: `kuhn-poker`, `KuhnPoker` and
`kuhn_poker` are one name, found in `make_kuhn_poker` but not in `kuhnpokers`.

"A key a game declares" is a key of a dict its `outcome()` builds, a field of its parameter
model (a pydantic model in its package) or an argument of its game class's constructor. A
generic module reading one (`x["agreed"]`, `x.get("max_turns")`) would know a game's outcome
or rules; it must ask the game instead (`Game.episode_metrics`, `Game.turn_budget`).
"""

from __future__ import annotations

import ast
import functools
import io
import re
import tokenize
from pathlib import Path

import pytest

from sparring.games import GAMES, game_class

ROOT = Path(__file__).resolve().parents[2] / "sparring"
GENERIC = sorted(p for p in ROOT.rglob("*.py") if ROOT / "games" not in p.parents)
GAME_MODULES = sorted((ROOT / "games").glob("*/*.py"))  # the games' packages, not the seam
ALWAYS = {"diplomacy", "matching", "country", "textarena"}  # the grep, kept as is


def words_of(text: str) -> tuple[str, ...]:
    """`"KuhnPoker-v0 rules"` -> ("kuhn", "poker", "v0", "rules")."""
    return tuple(w.lower() for w in re.findall(r"[A-Z]+(?![a-z])|[A-Z]?[a-z0-9]+", text))


def names(text: str, name: tuple[str, ...]) -> bool:
    """Whether `text` contains the words of `name`, in a row."""
    words, n = words_of(text), len(name)
    return any(words[i : i + n] == name for i in range(len(words) - n + 1))


def game_words() -> set[tuple[str, ...]]:
    """Every name that belongs to one game (see the module docstring)."""
    words = set(ALWAYS)
    for name, target in GAMES.items():
        words |= {name, target.split(":")[0].split(".")[2], target.split(":")[1]}
        try:
            cls = game_class(name)
        except ImportError:  # an optional game whose extra is not installed: its names only
            continue
        agents = {a for a in cls.agents if len(words_of(a)) > 1}  # not plain words like `hold`
        words |= agents | set(cls.extra_group_keys) | set(cls.group_key_aliases)
    return {words_of(w) for w in words}


def docstring_lines(source: str) -> set[int]:
    """First lines of every bare string statement: module, class and function docstrings, and
    the attribute docstrings under config fields."""
    return {
        node.lineno
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
    }


def code_hits(source: str, words: set[tuple[str, ...]]) -> list[tuple[int, str]]:
    """(line, token) of every code token (not a comment or docstring) naming a game."""
    docs = docstring_lines(source)
    hits = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.STRING and tok.start[0] in docs:
            continue
        if tok.type in (tokenize.NAME, tokenize.STRING) or tok.type == getattr(
            tokenize, "FSTRING_MIDDLE", -1
        ):
            if any(names(tok.string, w) for w in words):
                hits.append((tok.start[0], tok.string))
    return hits


def test_the_check_sees_code_and_skips_comments_and_docstrings():
    words = game_words()
    source = (
        '"""Plays matching and kuhn-poker."""\n'
        "# diplomacy is a game\n"
        "def f():\n"
        '    """country keys"""\n'
        '    return make("kuhn-poker") + TicTacToe + simple_negotiation\n'
    )
    assert [t for _, t in code_hits(source, words)] == [
        '"kuhn-poker"',
        "TicTacToe",
        "simple_negotiation",
    ]


@pytest.mark.parametrize("path", GENERIC, ids=lambda p: str(p.relative_to(ROOT)))
def test_generic_module_names_no_game(path):
    hits = code_hits(path.read_text(), game_words())
    assert not hits, f"{path.relative_to(ROOT.parent)} names a game in code: {hits}"


def declared_keys(source: str) -> set[str]:
    """The keys one game module declares (see the module docstring)."""
    keys = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef) and node.name == "outcome":
            dicts = [d for d in ast.walk(node) if isinstance(d, ast.Dict)]
            keys |= {k.value for d in dicts for k in d.keys if isinstance(k, ast.Constant)}
        if isinstance(node, ast.ClassDef):
            bases = {getattr(b, "id", getattr(b, "attr", "")) for b in node.bases}
            if "BaseModel" in bases:
                keys |= {f.target.id for f in node.body if isinstance(f, ast.AnnAssign)}
            if any(b.endswith("Game") for b in bases):
                inits = [f for f in node.body if getattr(f, "name", "") == "__init__"]
                keys |= {a.arg for f in inits for a in f.args.args[1:] + f.args.kwonlyargs}
    return keys


@functools.cache
def game_keys() -> frozenset[str]:
    """Every key a registered game declares."""
    return frozenset().union(*(declared_keys(p.read_text()) for p in GAME_MODULES))


def key_reads(source: str, keys: frozenset[str]) -> list[tuple[int, str]]:
    """(line, key) of every read of one of `keys`: `x["key"]`, `x.get("key")`, `x.pop("key")`."""
    hits = []
    for node in ast.walk(ast.parse(source)):
        key = None
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            key = node.slice.value
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("get", "pop")
            and node.args
            and isinstance(node.args[0], ast.Constant)
        ):
            key = node.args[0].value
        if isinstance(key, str) and key in keys:
            hits.append((node.lineno, key))
    return sorted(hits)


def test_the_key_check_finds_outcome_and_rule_reads():
    """What the seam's old leaks looked like: the agreement rate computed generically from the
    matching outcome, the time estimate reading matching's turn cap, a table size."""
    keys = game_keys()
    assert {"agreed", "winner", "centers", "max_turns", "k", "horizon", "max_rounds"} <= keys
    source = (
        'rate = sum(bool(e.outcome.get("agreed")) for e in eps)\n'
        'turns = cfg.game.params.get("max_turns", 8)\n'
        'size = params["k"]\n'
        'seed = state.get("seed")  # not a key any game declares\n'
    )
    assert key_reads(source, keys) == [(1, "agreed"), (2, "max_turns"), (3, "k")]


@pytest.mark.parametrize("path", GENERIC, ids=lambda p: str(p.relative_to(ROOT)))
def test_generic_module_reads_no_game_key(path):
    hits = key_reads(path.read_text(), game_keys())
    assert not hits, f"{path.relative_to(ROOT.parent)} reads keys a game declares: {hits}"
