"""The matching game's tables: seeded hidden reviewer-paper scores, each seat's view, and the
Hungarian optimum that normalizes the reward (dialop's rules, see sparring.games.matching)."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
from scipy.optimize import linear_sum_assignment

REVIEWERS = (
    "Ava",
    "Ben",
    "Cole",
    "Dana",
    "Eli",
    "Faye",
    "Gus",
    "Hana",
    "Ivan",
    "Jade",
    "Kai",
    "Lena",
    "Milo",
    "Nora",
    "Owen",
    "Pia",
)
PAPERS = (
    "BLEU",
    "GloVe",
    "ELMo",
    "BERT",
    "LoRA",
    "Adam",
    "ResNet",
    "GAN",
    "Dropout",
    "Word2Vec",
    "Seq2Seq",
    "T5",
    "RoBERTa",
    "PPO",
    "DQN",
    "CLIP",
)
DIALOP_REVIEWERS = (
    "Ava Li",
    "Daniel Nguyen",
    "Sofia Patel",
    "Andrei Petrov",
    "Morgan Reed",
    "Joseph Santos",
    "Ethan Smith",
    "Noah Wilson",
)
"""dialop's eight reviewers, fixed in every game (its `WORKERS`)."""
DIALOP_PAPERS = ("BLEU", "Electra", "GloVe", "GLUE", "LLaMA", "RoBERTa", "QuAC", "SWAG")
"""dialop's eight papers by their short titles, fixed in every game (its `TASKS_SHORT`)."""
NAME_SETS = {"pool": (REVIEWERS, PAPERS), "dialop": (DIALOP_REVIEWERS, DIALOP_PAPERS)}
"""`names` parameter -> (reviewers, papers) to draw from."""
MAX_VALUE = 100
"""Cell values are randint(0, MAX_VALUE): 0..99, as dialop's `np.random.randint(0, 100)`."""


def best_assignment(values: np.ndarray) -> tuple[list[int], float]:
    """Max-value perfect matching (row i -> column cols[i]) and its total value."""
    rows, cols = linear_sum_assignment(values, maximize=True)
    return cols.tolist(), float(values[rows, cols].sum())


def own_view_values(table: np.ndarray, visible: np.ndarray) -> list[float]:
    """The true value of each seat's best assignment from its own cells alone, an unseen cell
    counting 50 (`visible`: seat, reviewer, paper). The hard filter's test; `own_best_values`."""
    k = len(table)
    guesses = [np.where(seen, table, 50).astype(float) for seen in visible]
    return [float(table[np.arange(k), best_assignment(g)[0]].sum()) for g in guesses]


CHUNK = 256
"""Draws judged at once by the hard filter."""
MAX_PERMUTED_K = 5
"""Up to this k the hard filter is bounded for a whole chunk of draws at once, over all k!
assignments; above it every draw goes through the solver."""


def _draws(rng: np.random.Generator, k: int, p_visible: float, n: int) -> tuple[np.ndarray, ...]:
    """`n` attempts, drawn as a plain loop of attempts draws them: tables (n, reviewer, paper)
    with the cells neither seat sees set to 50, visibility (n, seat, reviewer, paper), and
    each seat's scale (n, 2)."""
    tables, seen, scales = [], [], []
    for _ in range(n):
        tables.append(rng.integers(0, MAX_VALUE, size=(k, k)))
        seen.append(rng.random((2, k, k)))
        scales.append(rng.uniform(1.0, 10.0, size=2))
    table, visible = np.stack(tables), np.stack(seen) < p_visible
    table[~visible[:, 0] & ~visible[:, 1]] = 50
    return table, visible, np.stack(scales)


def _is_hard(table: np.ndarray, visible: np.ndarray, hard_ratio: float) -> bool:
    """dialop's filter: each seat's own-view optimum (the solver's, ties broken by position) is
    worth less than the optimum / `hard_ratio`."""
    best = best_assignment(table.astype(float))[1]
    return max(own_view_values(table, visible)) < best / hard_ratio


def _surely(tables: np.ndarray, visible: np.ndarray, hard_ratio: float) -> tuple[np.ndarray, ...]:
    """Per draw, whether it is hard (or easy) whichever optimum the solver picks among ties:
    exhaustive over the k! assignments of every draw at once. Neither, for k > MAX_PERMUTED_K."""
    n, k = tables.shape[:2]
    if k > MAX_PERMUTED_K:
        return np.zeros(n, bool), np.zeros(n, bool)
    perms = np.array(list(itertools.permutations(range(k))))  # (P, k)
    rows = np.arange(k)
    true = tables[:, rows, perms].sum(-1).astype(float)  # (n, P): each assignment's true value
    threshold = true.max(1) / hard_ratio  # (n,)
    hard, easy = np.ones(n, bool), np.zeros(n, bool)
    for seat in range(2):
        guess = np.where(visible[:, seat], tables, 50)[:, rows, perms].sum(-1)  # (n, P)
        optimal = guess == guess.max(1, keepdims=True)
        hard &= np.where(optimal, true, -np.inf).max(1) < threshold
        easy |= np.where(optimal, true, np.inf).min(1) >= threshold
    return hard, easy


def _first_hard_draw(
    rng: np.random.Generator, k: int, p_visible: float, hard_ratio: float | None, max_tries: int
) -> tuple[int, np.ndarray, np.ndarray, np.ndarray, bool]:
    """(attempt number, table, visibility, scales, hard) of the first draw `_is_hard` keeps, or
    of the last of `max_tries` with hard False; `rng` is left just after it, as a plain loop of
    attempts would leave it. Draws are judged a chunk at a time, by the solver only where
    `_surely` leaves them open."""
    if hard_ratio is None:  # any table will do: the first
        tables, visible, scales = _draws(rng, k, p_visible, 1)
        return 1, tables[0], visible[0], scales[0], True
    done = 0
    while done < max_tries:
        start = rng.bit_generator.state
        tables, visible, scales = _draws(rng, k, p_visible, min(CHUNK, max_tries - done))
        hard, easy = _surely(tables, visible, hard_ratio)
        for i in np.flatnonzero(~easy):  # in order
            if hard[i] or _is_hard(tables[i], visible[i], hard_ratio):
                rng.bit_generator.state = start  # replay up to this draw, to leave rng after it
                _draws(rng, k, p_visible, i + 1)
                return done + int(i) + 1, tables[i], visible[i], scales[i], True
        done += len(tables)
    return max_tries, tables[-1], visible[-1], scales[-1], False


def generate_state(
    seed: int,
    k: int = 8,
    p_visible: float = 0.4,
    hard_ratio: float | None = 1.25,
    max_tries: int = 20000,
    random_names: bool = True,
    names: str = "pool",
) -> dict[str, Any]:
    """A seeded, JSON-serialisable initial state. The same arguments always give the same state.

    `names` picks the name set (`NAME_SETS`): "pool" (16 short names each) or "dialop" (dialop's
    8 fixed reviewers and papers, k <= 8). `random_names=False` always uses the first k names of
    the set, in order (the table is unchanged): dialop's setting, and an easier variant for CPU
    learning curves, where a tiny model can't yet copy names from its table.

    Like dialop, if no hard table turns up in `max_tries` draws the last one is kept and the
    state says `"hard": False` (at k=8 a hard table takes ~6000 draws, ~0.3 s).
    """
    if names not in NAME_SETS:
        raise ValueError(f"unknown names {names!r}; choose one of {sorted(NAME_SETS)}")
    reviewers, papers = NAME_SETS[names]
    if not 2 <= k <= len(reviewers):
        raise ValueError(f"k must be in [2, {len(reviewers)}] with names={names!r}, got {k}")
    rng = np.random.default_rng(seed)
    attempt, table, visible, scales, hard = _first_hard_draw(
        rng, k, p_visible, hard_ratio, max_tries
    )
    own = own_view_values(table, visible)
    # The filter's own-view proposals break ties by position (the solver's first optimum), so
    # the tables it keeps have a poor low-index diagonal: a fixed positional deal beat a random
    # one (docs/results.md, "Trivial baselines, matching k=3"). Shuffling reviewers and
    # papers afterwards leaves no position informative, and `own_best_values` the values of
    # own-view optima whose ties were broken at random.
    rows, cols = rng.permutation(k), rng.permutation(k)
    table, visible = table[np.ix_(rows, cols)], visible[:, rows][:, :, cols]
    best_cols, best = best_assignment(table.astype(float))
    picked = rng.permutation(len(reviewers))[:k], rng.permutation(len(papers))[:k]
    if not random_names:
        picked = np.arange(k), np.arange(k)
    views = [
        [
            [int(table[r, p] * scales[s]) if visible[s, r, p] else None for p in range(k)]
            for r in range(k)
        ]
        for s in range(2)
    ]
    return {
        "seed": int(seed),
        "k": k,
        "reviewers": [reviewers[i] for i in picked[0]],
        "papers": [papers[i] for i in picked[1]],
        "table": table.tolist(),
        "views": views,
        "scales": scales.tolist(),
        "best_value": best,
        "best_assignment": best_cols,
        "own_best_values": own,
        "attempts": attempt,
        "hard": bool(hard),
    }
