"""The scratchpad teacher: the scripted agent's moves, with its working written before them."""

from __future__ import annotations

import re

from sparring.games import make_game
from sparring.games.matching import MatchingGame

SUM = re.compile(r"= ([\d+]+) = (\d+)")


def play(agent: str, seed: int, k: int = 3) -> tuple[list[dict], list[str], list[str]]:
    """(actions, texts written, observations the seats were sent) of one self-play game."""
    game = make_game("matching", k=k, max_turns=8)
    game.reset(game.generate_state(seed))
    teacher = MatchingGame.make_agent(agent)
    actions, texts = [], []
    while not game.done:
        seat = game.current_seat
        text = teacher.act(game, seat)
        result = game.step(seat, text)
        assert result.ok, (text, result.error)
        actions.append(result.action)
        texts.append(text)
    heard = [m["content"] for s in (0, 1) for m in game.messages(s) if m["role"] == "user"]
    return actions, texts, heard


def test_scratchpad_plays_the_scripted_moves():
    # Rounding the merged table may break a near-tie differently; the moves are otherwise equal.
    same = sum(
        play("matching-scratchpad", s)[0] == play("matching-scripted", s)[0] for s in range(30)
    )
    assert same >= 28


def test_scratchpad_working_adds_up_and_stays_private():
    proposals = 0
    for seed in range(12):
        _, texts, heard = play("matching-scratchpad", seed)
        for text in texts:
            for terms, total in SUM.findall(text):
                assert sum(int(t) for t in terms.split("+")) == int(total), text
            if "[propose]" in text:
                proposals += 1
                work, plan = text.split("[propose]")
                assert len(re.findall(r"^.+ = .+ = \d+$", work, re.M)) == 6 + 1  # 3! plans, best
                best = re.search(r"^Best: (.+?) =", work, re.M).group(1)
                pairs = [line.split(": ") for line in plan.strip().splitlines()]
                assert best == " ".join(p for _, p in pairs)
        assert not any("Plans" in h or "My table" in h or "My best" in h for h in heard)
    assert proposals >= 12


def test_scratchpad_lists_only_the_best_plan_for_larger_tables():
    _, texts, _ = play("matching-scratchpad", 0, k=4)
    proposal = next(t for t in texts if "[propose]" in t)
    assert "Plans" not in proposal and proposal.count("Best: ") == 1
