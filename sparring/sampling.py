"""Country-balanced batches of samples (seed 001: every batch holds k episodes per country).

    batches = country_balanced_batches(samples_df, k=4, seed=0)   # each: 4 rows per country

A samples row is one (game, seat) episode, so "k episodes per country" means k rows per value
of the `key` column (`country` for Diplomacy, or any group-key column). Rows of each country
are shuffled with a generator seeded by `seed`; batch i takes rows [i*k, (i+1)*k) of every
country, so the number of batches is (fewest rows of any country) // k. Rows beyond that are
left out of this epoch, never duplicated: duplicates would skew the per-country GRPO baseline.
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def country_balanced_batches(
    df: pd.DataFrame, k: int, seed: int = 0, key: str = "country"
) -> list[pd.DataFrame]:
    """Split `df` into batches of exactly `k` rows per `key` value, each batch shuffled."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if key not in df.columns:
        raise ValueError(f"samples have no {key!r} column; columns are {sorted(df.columns)}")
    counts = df[key].value_counts()
    if counts.empty or counts.min() < k:
        raise ValueError(
            f"need at least k={k} rows of every {key}, got {counts.to_dict()}; lower k or "
            "play more games"
        )
    rng = np.random.default_rng(seed)
    shuffled = {
        c: rng.permutation(np.flatnonzero(df[key].to_numpy() == c)) for c in sorted(counts.index)
    }
    batches = []
    for i in range(int(counts.min()) // k):
        rows = np.concatenate([idx[i * k : (i + 1) * k] for idx in shuffled.values()])
        batches.append(df.iloc[rng.permutation(rows)].reset_index(drop=True))
    return batches
