"""Country-balanced batches and the per-country difficulty schedule."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from sparring.curriculum import DifficultyConfig, DifficultySchedule
from sparring.sampling import country_balanced_batches


def samples(counts: dict[str, int]) -> pd.DataFrame:
    rows = [{"sample_id": f"{c}{i}", "country": c} for c, n in counts.items() for i in range(n)]
    return pd.DataFrame(rows)


def test_batches_hold_k_rows_per_country_without_duplicates():
    df = samples({"FRANCE": 9, "ENGLAND": 5, "TURKEY": 7})
    batches = country_balanced_batches(df, k=2, seed=3)
    assert len(batches) == 5 // 2  # limited by the rarest country
    for batch in batches:
        assert batch.country.value_counts().to_dict() == {"FRANCE": 2, "ENGLAND": 2, "TURKEY": 2}
    ids = pd.concat(batches).sample_id
    assert ids.is_unique
    again = country_balanced_batches(df, k=2, seed=3)
    assert all(a.equals(b) for a, b in zip(batches, again, strict=True))
    other = country_balanced_batches(df, k=2, seed=4)
    assert not all(a.equals(b) for a, b in zip(batches, other, strict=True))


def test_batches_reject_too_few_rows_and_missing_column():
    with pytest.raises(ValueError, match="at least k=3"):
        country_balanced_batches(samples({"FRANCE": 5, "ITALY": 2}), k=3)
    with pytest.raises(ValueError, match="no 'country' column"):
        country_balanced_batches(pd.DataFrame({"role": ["a"]}), k=1)


def test_difficulty_moves_up_when_easy_down_when_hard_and_clamps():
    cfg = DifficultyConfig(
        pool=["hold", "random-legal", "greedy"], window=2, raise_above=0.5, lower_below=0.2
    )
    sched = DifficultySchedule(cfg)
    assert sched.opponent("FRANCE") == "hold"
    assert sched.update(0, {"FRANCE": [0.9], "ITALY": [0.1]}) == {}  # window not full yet
    assert sched.update(1, {"FRANCE": [0.7], "ITALY": [0.1]}) == {"FRANCE": 1}  # mean 0.8
    assert sched.opponent("FRANCE") == "random-legal" and sched.opponent("ITALY") == "hold"
    assert sched.update(2, {"FRANCE": [0.9, 0.9]}) == {"FRANCE": 1}
    assert sched.update(3, {"FRANCE": [0.9, 0.9]}) == {}  # already at the strongest
    assert sched.update(4, {"FRANCE": [0.1, 0.0]}) == {"FRANCE": -1}  # mean 0.05
    assert sched.update(5, {"FRANCE": [0.3, 0.4]}) == {}  # in the band: stays
    assert sched.opponent("FRANCE") == "random-legal"
    assert sched.metrics() == {"difficulty/FRANCE": 1.0, "difficulty/ITALY": 0.0}
    row = sched.history[2]
    assert row == {
        "iteration": 1,
        "country": "FRANCE",
        "mean_reward": pytest.approx(0.8),
        "level": 1,
        "opponent": "random-legal",
        "change": 1,
    }
    copy = DifficultySchedule.from_dict(json.loads(json.dumps(sched.to_dict())))
    assert copy.to_dict() == sched.to_dict()


def test_difficulty_config_checks():
    with pytest.raises(ValueError, match="start_level"):
        DifficultyConfig(pool=["hold"], start_level=1)
    with pytest.raises(ValueError, match="lower_below"):
        DifficultyConfig(raise_above=0.1, lower_below=0.2)
