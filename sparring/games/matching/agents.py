"""A scripted baseline for the matching game.

Strategy, one seat's point of view:
1. Share: send its highest known cells as `[message] Reviewer Paper value; ...`.
2. Merge: read the partner's shared cells, convert them into its own scale (median ratio on
   cells both have seen, else the ratio of means), fill unknown cells with its mean value.
3. Propose the Hungarian assignment over the merged table once it has heard the partner.
4. Accept a proposal worth >= `accept_ratio` of its own best plan on the merged table;
   otherwise reject. After a reject (the rejecting seat keeps the turn, as in dialop) each
   seat shares everything it knows before proposing again, so the next plan uses both views.
It only reads its own view (`state["views"][seat]`) and its own chat.

`ScratchpadMatchingAgent` plays the same moves and writes its working on the lines before each
proposal and answer (the game lets reasoning precede the action line, and the partner sees only
the action): the partner's cells converted into its own units, the merged table, every plan's
total when there are few (k! <= `max_plans`) or else the best one, and the total it compares
when it answers. Imitating it shows a model the computation, not only its result.
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass

import numpy as np

from sparring.games.matching.game import MatchingGame
from sparring.games.matching.parse import match_name
from sparring.games.matching.prompt import render_table, share_message
from sparring.games.matching.table import best_assignment


@dataclass
class Knowledge:
    """What a seat knows when it proposes: its own cells (NaN unseen), the partner's cells
    as heard, the ratio that converts them into its units and the merged table."""

    own: np.ndarray
    heard: dict[tuple[int, int], float]
    ratio: float
    merged: np.ndarray


class ScriptedMatchingAgent:
    """Share, merge, propose the Hungarian optimum, accept good proposals."""

    def __init__(self, max_share: int | None = None, accept_ratio: float = 0.9) -> None:
        self.max_share = max_share  # cells per message; None = 2k
        self.accept_ratio = accept_ratio

    def act(self, game: MatchingGame, seat: int) -> str:
        state = game.state
        own = np.array(
            [[np.nan if v is None else v for v in row] for row in state["views"][seat]], dtype=float
        )
        chat = game.messages(seat)
        heard = self._heard_cells(chat, state)
        last = chat[-1]["content"]
        merged, ratio = self._merge(own, heard)
        pending = _pending_proposal(last, state)
        if pending is not None:
            return self._answer(state, merged, pending)
        mine = [
            m["content"] for m in chat if m["role"] == "assistant" and "[message]" in m["content"]
        ]
        cell = _cell_re(state)
        shared_all = any(len(cell.findall(m)) >= (~np.isnan(own)).sum() for m in mine)
        rejected = "You rejected the proposal" in last or "Partner: [reject]" in last
        if heard and not (rejected and not shared_all):
            return self._propose(game, Knowledge(own, heard, ratio, merged))
        # Share the top cells first, then everything once a plan was rejected.
        limit = None if rejected or mine else (self.max_share or 2 * state["k"])
        return share_message(state, seat, limit)

    def _answer(self, state: dict, merged: np.ndarray, pending: list[int]) -> str:
        """Accept a plan worth `accept_ratio` of the best on the merged table."""
        _, best = best_assignment(merged)
        value = merged[np.arange(len(pending)), pending].sum()
        return "[accept]" if value >= self.accept_ratio * best else "[reject]"

    def _propose(self, game: MatchingGame, known: Knowledge) -> str:
        """The Hungarian optimum of the merged table."""
        cols, _ = best_assignment(known.merged)
        return game.render_proposal(cols)

    @staticmethod
    def _heard_cells(chat: list[dict[str, str]], state: dict) -> dict[tuple[int, int], float]:
        """Cells the partner shared, parsed from `Partner: [message] ...` lines."""
        heard: dict[tuple[int, int], float] = {}
        cell = _cell_re(state)
        for m in chat:
            if m["role"] != "user":
                continue
            for line in m["content"].splitlines():
                if not line.startswith("Partner: [message]"):
                    continue
                for r, p, v in cell.findall(line):
                    rn, pn = match_name(r, state["reviewers"]), match_name(p, state["papers"])
                    if rn and pn:
                        heard[(state["reviewers"].index(rn), state["papers"].index(pn))] = float(v)
        return heard

    @staticmethod
    def _merge(own: np.ndarray, heard: dict[tuple[int, int], float]) -> tuple[np.ndarray, float]:
        """Own cells + partner cells rescaled into own units (times the returned ratio);
        unknown cells = own mean."""
        known = own[~np.isnan(own)]
        mean_own = float(known.mean()) if known.size else 50.0
        ratio = 1.0
        if heard:
            overlap = [own[c] / v for c, v in heard.items() if not np.isnan(own[c]) and v > 0]
            mean_heard = float(np.mean(list(heard.values()))) or 1.0
            ratio = float(np.median(overlap)) if overlap else mean_own / mean_heard
        merged = own.copy()
        for (r, p), v in heard.items():
            if np.isnan(merged[r, p]):
                merged[r, p] = v * ratio
        return np.where(np.isnan(merged), mean_own, merged), ratio


class ScratchpadMatchingAgent(ScriptedMatchingAgent):
    """The scripted agent, writing its working before each proposal and answer (see the
    module docstring). Its merged table is rounded to whole numbers, so every sum it writes
    adds up."""

    def __init__(self, max_plans: int = 6, **params: float) -> None:
        super().__init__(**params)
        self.max_plans = max_plans  # list every plan's total when k! <= this

    def _answer(self, state: dict, merged: np.ndarray, pending: list[int]) -> str:
        table = np.rint(merged)
        _, best = best_assignment(table)
        work = f"Your plan on my table: {_plan(state, table, pending)}. My best: {int(best)}."
        return work + "\n" + super()._answer(state, table, pending)

    def _propose(self, game: MatchingGame, known: Knowledge) -> str:
        state, table, own, heard = game.state, np.rint(known.merged), known.own, known.heard
        names = state["reviewers"], state["papers"]
        used = [(c, v) for c, v in sorted(heard.items()) if np.isnan(own[c])]
        lines = []
        if used:
            cells = ", ".join(
                f"{names[0][r]} {names[1][p]} {int(v)}x{known.ratio:.2f}={int(table[r, p])}"
                for (r, p), v in used
            )
            lines.append(f"Partner's numbers in my units: {cells}")
        views = [
            [
                f"~{int(table[r, p])}"
                if np.isnan(own[r, p]) and (r, p) not in heard
                else str(int(table[r, p]))
                for p in range(len(table))
            ]
            for r in range(len(table))
        ]
        lines += ["My table with them (~: nobody shared it, my average):"]
        lines += [render_table({**state, "views": [views]}, 0)]
        k = len(table)
        if math.factorial(k) <= self.max_plans:
            lines += [f"Plans (papers for {', '.join(state['reviewers'])}):"] + [
                _plan(state, table, list(perm)) for perm in itertools.permutations(range(k))
            ]
        cols, _ = best_assignment(table)
        lines.append(f"Best: {_plan(state, table, cols)}")
        return "\n".join([*lines, game.render_proposal(cols)])


def _plan(state: dict, table: np.ndarray, cols: list[int]) -> str:
    """`BLEU GloVe = 58+120 = 178`: a plan's papers in reviewer order, its cells, its total."""
    values = [int(table[r, c]) for r, c in enumerate(cols)]
    papers = " ".join(state["papers"][c] for c in cols)
    return f"{papers} = {'+'.join(map(str, values))} = {sum(values)}"


def _cell_re(state: dict) -> re.Pattern[str]:
    """`Reviewer Paper value` for this game's names (names may hold spaces)."""
    reviewers = "|".join(re.escape(n) for n in state["reviewers"])
    papers = "|".join(re.escape(n) for n in state["papers"])
    return re.compile(rf"({reviewers})\s+({papers})\s*[:=]?\s*(\d+)", re.IGNORECASE)


def _pending_proposal(last_user: str, state: dict) -> list[int] | None:
    """The partner's proposal if the last thing said to us was one (reviewer i -> paper idx)."""
    if "Partner: [propose]" not in last_user:
        return None
    body = last_user.split("Partner: [propose]", 1)[1]
    cols = {}
    for line in body.strip().splitlines():
        if ":" in line:
            r, p = (s.strip() for s in line.split(":", 1))
            if r in state["reviewers"] and p in state["papers"]:
                cols[state["reviewers"].index(r)] = state["papers"].index(p)
    return [cols[i] for i in range(state["k"])] if len(cols) == state["k"] else None
