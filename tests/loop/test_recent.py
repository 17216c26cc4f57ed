"""The rolling per-role window (`sparring.loop.recent`): kept per role across iterations,
carried through storage, summarised with the game's own metrics."""

from __future__ import annotations

import json

import pytest

from sparring.loop.config import PipelineConfig
from sparring.loop.io import run_uri
from sparring.loop.recent import (
    RECENT_FILE,
    recent_metrics,
    recent_state,
    save_recent,
    update_recent,
)

pytest.importorskip("diplomacy")

ROLES = ["AUSTRIA", "ENGLAND", "FRANCE", "GERMANY", "ITALY", "RUSSIA", "TURKEY"]


def episode(n: int, gains: list[int], learner_seats: list[int]) -> dict:
    """A Diplomacy games.jsonl episode: every power starts on 4 centers and gains `gains`."""
    start = dict.fromkeys(ROLES, 4)
    stats = {"orders": 3, "invalid_orders": 0, "missing_orders": 0, "press_sent": 0}
    return {
        "game_id": f"g{n}",
        "game_name": "diplomacy",
        "roles": ROLES,
        "seat_policies": ["policy" if s in learner_seats else "greedy" for s in range(7)],
        "rewards": [(4 + g) / 18 for g in gains],
        "transcript": [{"seat": 0, "text": "A VIE H" * 100}],
        "messages": [[{"role": "user", "content": "x" * 1000}]] * 7,
        "outcome": {
            "centers": {p: 4 + g for p, g in zip(ROLES, gains, strict=True)},
            "start_centers": start,
            "eliminated": [],
            "solo": None,
            "moves": 2,
            "power_stats": dict.fromkeys(ROLES, stats),
        },
    }


def test_the_window_keeps_each_roles_last_plays_without_transcripts():
    rows = []
    for it in range(3):  # 4 games an iteration, the learner as AUSTRIA; in game 3 also TURKEY
        eps = [episode(4 * it + g, [0] * 7, [0, 6] if g == 3 else [0]) for g in range(4)]
        rows = update_recent(rows, eps, it, size=5)
    austria = [r for r in rows if r["role"] == "AUSTRIA"]
    assert [r["episode"]["game_id"] for r in austria] == ["g7", "g8", "g9", "g10", "g11"]
    assert [r["episode"]["game_id"] for r in rows if r["role"] == "TURKEY"] == ["g3", "g7", "g11"]
    assert all("transcript" not in r["episode"] and "messages" not in r["episode"] for r in rows)
    # a retried rollout's rows replace its own earlier ones instead of adding to them
    retried = update_recent(rows, [episode(99, [0] * 7, [0])], 2, size=5)
    assert [r["episode"]["game_id"] for r in retried if r["iteration"] == 2] == ["g99"]


def test_recent_metrics_per_country_with_a_one_year_win_rate():
    # Austria gains 2 (alone the most) in the first game; in the second Austria and Italy tie
    # on +1; in the third nobody gains: win rate (1 + 1/2 + 0) / 3 = 0.5
    rows = update_recent(
        [],
        [
            episode(0, [2, 0, 0, 1, -3, 0, 0], [0]),
            episode(1, [1, 0, 0, 0, 1, -2, 0], [0]),
            episode(2, [0] * 7, [0]),
        ],
        0,
    )
    m = recent_metrics(rows)
    assert m["rollout/recent/country/AUSTRIA/games"] == 3
    assert m["rollout/recent/country/AUSTRIA/win_rate"] == pytest.approx(0.5)
    # gain share: 2 / (2 + 1), 1 / (1 + 1), 0 -> (2/3 + 1/2) / 3
    assert m["rollout/recent/country/AUSTRIA/gain_share"] == pytest.approx((2 / 3 + 0.5) / 3)
    assert m["rollout/recent/country/AUSTRIA/center_gain"] == pytest.approx(1.0)
    assert m["rollout/recent/country/AUSTRIA/normalized_reward"] == pytest.approx(5 / 18)
    assert not any("ENGLAND" in k for k in m)  # the learner never played England
    assert recent_metrics([]) == {}


def test_the_window_is_carried_through_the_stored_rollout(tmp_path):
    cfg = PipelineConfig.model_validate({"game": "diplomacy", "storage": {"root": str(tmp_path)}})
    assert recent_state(cfg, "run", 0) == []
    out = tmp_path / "run" / "0" / "rollout"  # where rollout 0 uploads (a local root)
    out.mkdir(parents=True)
    first = save_recent([], [episode(0, [1, 0, 0, 0, 0, 0, 0], [0])], 0, out)
    assert first["rollout/recent/country/AUSTRIA/games"] == 1
    assert run_uri(cfg, "run", 0, "rollout") == str(out)
    rows = recent_state(cfg, "run", 1)  # rollout 1 (or a restarted one) reads rollout 0's
    assert rows == [json.loads(line) for line in (out / RECENT_FILE).read_text().splitlines()]
    second = save_recent(rows, [episode(1, [0] * 7, [0])], 1, tmp_path)
    assert second["rollout/recent/country/AUSTRIA/games"] == 2
    assert second["rollout/recent/country/AUSTRIA/win_rate"] == pytest.approx(0.5)
    assert recent_state(cfg, "run", 5, previous=tmp_path / RECENT_FILE)[-1]["iteration"] == 1
