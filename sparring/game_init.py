"""game-init: seeded initial game states, written to parquet with train, val and test splits.

    sparring game-init --game matching --param k=4 --train 256 --val 64 --test 64 --out runs/inits

Val states are for choices (the champion), test states for claims (a run's final figures,
played once at the end). The same (game, params, seed, counts) always gives the same states:
each state's seed is derived from (seed, split, index) with numpy's SeedSequence, so the
splits are disjoint and growing one never changes another's games. Columns: init_id, split, index, seed, game, params (JSON), state (JSON).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field
from tqdm.auto import tqdm

from sparring.games import GameSpec

SPLITS = {"train": 0, "val": 1, "test": 2}


class GameInitConfig(BaseModel):
    """What game-init generates."""

    model_config = ConfigDict(extra="forbid")

    game: GameSpec = Field(default_factory=GameSpec)
    """The game and its rules; the rollout must use the same."""
    num_train: int = Field(256, ge=0)
    num_val: int = Field(64, ge=0)
    num_test: int = Field(0, ge=0)
    """Held-out states a run's final model is scored on once; 0 = no test evaluation."""
    seed: int = 0
    """Base seed; per-state seeds derive from (seed, split, index)."""


def state_seed(seed: int, split: str, index: int) -> int:
    """A 32-bit seed unique to (seed, split, index)."""
    return int(np.random.SeedSequence([seed, SPLITS[split], index]).generate_state(1)[0])


def generate_inits(cfg: GameInitConfig, progress: bool = True) -> pd.DataFrame:
    """All initial states of every split as one DataFrame."""
    game = cfg.game.make()
    rows = []
    counts = {"train": cfg.num_train, "val": cfg.num_val, "test": cfg.num_test}
    todo = [(split, i) for split, n in counts.items() for i in range(n)]
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
    """Write train.parquet, val.parquet and test.parquet into `out_dir`; returns their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    df = generate_inits(cfg, progress)
    paths = {}
    for split in SPLITS:
        paths[split] = out / f"{split}.parquet"
        df[df.split == split].reset_index(drop=True).to_parquet(paths[split], index=False)
    return paths
