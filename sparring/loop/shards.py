"""Rollout fan-out (`rollout.shards: N`): N tasks each play a slice of an iteration's initial
states, then one task merges their folders into the rollout a single task would have written.

    shard_states(states, 4, 1)                                  # the 2nd of 4 contiguous slices
    play_shard(cfg, model, train_inits, iteration, games, k, out_k)   # in shard task k
    merge(cfg, [out_0, ..., out_3], out, run_name, iteration)         # in the merge task

1. Shards split by initial state, and every play of a state stays in its shard, so no `init`
   or `game` group is ever split across tasks.
2. Each shard plays exactly what the single task plays for its states: the same iteration
   seed, and per-seat sampling seeds derived from the game and seat, not the batch
   (`sparring.generation.base.row_seeds`).
3. The merge concatenates games.jsonl and samples.parquet in shard order (= the single task's
   order) and recomputes `rollout/*` from the merged episodes, so the iteration's metrics and
   the training data are those of one rollout. `perf/rollout_seconds` sums the shards' compute;
   `perf/rollout_wall_seconds` is the slowest shard.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sparring.loop import steps, tasks
from sparring.loop.config import PipelineConfig
from sparring.loop.io import log, run_uri, upload
from sparring.rollout import Episode, RolloutResult, build_policies, rollout_stats
from sparring.samples import read_samples


def shard_states(states: list[Any], shards: int, index: int) -> list[Any]:
    """Contiguous slice `index` of `shards` near-equal slices of `states` (sizes differ by at
    most one); concatenating the slices in index order gives `states` back."""
    if not 0 <= index < shards:
        raise ValueError(f"shard index {index} is outside 0..{shards - 1}")
    if shards > len(states):
        raise ValueError(
            f"rollout.shards={shards} exceeds the iteration's {len(states)} initial states: "
            "lower rollout.shards or raise games_per_iteration"
        )
    return states[index * len(states) // shards : (index + 1) * len(states) // shards]


def play_shard(
    cfg: PipelineConfig,
    model_dir: str,
    train_inits: str,
    iteration: int,
    games: int,
    shard: int,
    out_dir: str | Path,
) -> dict[str, float]:
    """Play shard `shard` of the iteration's states (pure self-play) into `out_dir`:
    games.jsonl, samples.parquet and stats.json, as `tasks.rollout` writes them."""
    states, rcfg = tasks.iteration_plan(cfg, train_inits, iteration, games)
    mine = shard_states(states, cfg.rollout.shards, shard)
    policies = build_policies(
        cfg.game, model_dir, rcfg.seats, cfg.device, rcfg.max_batch_size, backend=rcfg.backend
    )
    played = steps.self_play(mine, policies, rcfg, out_dir)
    log(f"iteration {iteration}: shard {shard} played {len(mine)} states")
    return played.metrics


def merge(
    cfg: PipelineConfig,
    shard_dirs: list[str | Path],
    out_dir: str | Path,
    run_name: str,
    iteration: int,
) -> dict[str, float]:
    """Merge shard folders (in shard order) into one rollout folder in `out_dir`, upload it to
    `<root>/<run>/<iteration>/rollout` and return its metrics (see the module docstring)."""
    if not shard_dirs:
        raise ValueError("no rollout shards to merge")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    lines = [line for d in shard_dirs for line in _read_lines(Path(d) / "games.jsonl")]
    (out / "games.jsonl").write_text("".join(lines))
    shard_stats = [json.loads((Path(d) / "stats.json").read_text()) for d in shard_dirs]
    samples = [Path(d) / "samples.parquet" for d in shard_dirs]
    present = [p for p in samples if p.exists()]
    if present:
        read_samples(present).to_parquet(out / "samples.parquet", index=False)
    result = RolloutResult(
        episodes=[Episode(**json.loads(line)) for line in lines],
        samples=[],
        seconds=sum(s["perf/rollout_seconds"] for s in shard_stats),
        generate_calls=int(sum(s["perf/generate_calls"] for s in shard_stats)),
        generated_tokens=int(sum(s["perf/generated_tokens"] for s in shard_stats)),
    )
    stats = rollout_stats(result) | {
        "perf/rollout_wall_seconds": max(s["perf/rollout_seconds"] for s in shard_stats),
        "perf/rollout_shards": float(len(shard_dirs)),
    }
    (out / "stats.json").write_text(json.dumps(stats, indent=2))
    upload(cfg, out, run_uri(cfg, run_name, iteration, "rollout"))
    log(
        f"iteration {iteration}: merged {len(shard_dirs)} shards, "
        f"rollout reward {stats['rollout/normalized_reward']:.3f}"
    )
    return stats


def _read_lines(path: Path) -> list[str]:
    if not path.exists():
        raise FileNotFoundError(f"rollout shard without games.jsonl: {path.parent}")
    return path.read_text().splitlines(keepends=True)
