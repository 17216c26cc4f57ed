"""game-init: seeded initial game states, written to parquet with train and val splits.

    sparring game-init --game matching --param k=4 --train 256 --val 64 --seed 0 --out runs/inits

The same (game, params, seed, counts) always gives the same states: each state's seed is
derived from (seed, split, index) with numpy's SeedSequence, so growing --train never changes
the val games. Columns: init_id, split, index, seed, game, params (JSON), state (JSON).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field
from tqdm.auto import tqdm

from sparring.games import GameSpec

SPLITS = {"train": 0, "val": 1}


class GameInitConfig(BaseModel):
    """What game-init generates."""

    model_config = ConfigDict(extra="forbid")

    game: GameSpec = Field(default_factory=GameSpec)
    """The game and its rules; the rollout must use the same."""
    num_train: int = Field(256, ge=0)
    num_val: int = Field(64, ge=0)
    seed: int = 0
    """Base seed; per-state seeds derive from (seed, split, index)."""


def state_seed(seed: int, split: str, index: int) -> int:
    """A 32-bit seed unique to (seed, split, index)."""
    return int(np.random.SeedSequence([seed, SPLITS[split], index]).generate_state(1)[0])


def generate_inits(cfg: GameInitConfig, progress: bool = True) -> pd.DataFrame:
    """All initial states of both splits as one DataFrame."""
    game = cfg.game.make()
    rows = []
    todo = [("train", i) for i in range(cfg.num_train)] + [("val", i) for i in range(cfg.num_val)]
    for split, i in tqdm(todo, desc="game-init", unit="state", disable=not progress):
        seed = state_seed(cfg.seed, split, i)
        rows.append(
            {
                "init_id": f"{split}-{i:06d}",
                "split": split,
                "index": i,
                "seed": seed,
                "game": cfg.game.name,
                "params": json.dumps(cfg.game.params, sort_keys=True),
                "state": json.dumps(game.generate_state(seed)),
            }
        )
    return pd.DataFrame(rows)


def write_inits(cfg: GameInitConfig, out_dir: str | Path, progress: bool = True) -> dict[str, Path]:
    """Write train.parquet and val.parquet into `out_dir`; returns their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    df = generate_inits(cfg, progress)
    paths = {}
    for split in SPLITS:
        paths[split] = out / f"{split}.parquet"
        df[df.split == split].reset_index(drop=True).to_parquet(paths[split], index=False)
    return paths
