"""game-init's splits: train for updates, val for choices, test for claims."""

from __future__ import annotations

import pandas as pd
import pytest

from sparring.game_init import GameInitConfig, generate_inits, write_inits

GAME = {"params": {"k": 3}}


def test_the_three_splits_are_disjoint(tmp_path):
    paths = write_inits(GameInitConfig(game=GAME, num_train=20, num_val=10, num_test=10), tmp_path)
    frames = {split: pd.read_parquet(path) for split, path in paths.items()}
    assert {s: len(f) for s, f in frames.items()} == {"train": 20, "val": 10, "test": 10}
    assert set(frames["test"].split) == {"test"}
    seeds = [set(f.seed) for f in frames.values()]
    states = [set(f.state) for f in frames.values()]
    for i in range(3):  # no seed, hence no game, is in two splits
        for j in range(i):
            assert not seeds[i] & seeds[j] and not states[i] & states[j]


@pytest.mark.parametrize("grown", ["num_train", "num_val", "num_test"])
def test_growing_one_split_leaves_the_others_unchanged(grown):
    counts = {"num_train": 4, "num_val": 3, "num_test": 3}
    before = generate_inits(GameInitConfig(game=GAME, **counts), progress=False)
    after = generate_inits(GameInitConfig(game=GAME, **counts | {grown: 8}), progress=False)
    for split in ("train", "val", "test"):
        old = before[before.split == split].reset_index(drop=True)
        new = after[after.split == split].reset_index(drop=True)
        if f"num_{split}" == grown:  # the grown split keeps its first states
            assert len(new) == 8 and new.head(len(old)).equals(old)
        else:
            assert new.equals(old)
