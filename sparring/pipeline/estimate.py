"""How long `sparring run` should take: a rough wall-time estimate printed at the start.

Only for the tiny model on CPU, where the costs per unit below were measured (per-task times
of one `make run` on 2 idle CPU cores, 6:59 wall, docs/results.md); a real model or a GPU gets
no estimate.
The rollout and eval costs are per game at the default's per-turn budget (`max_new_tokens`
times `max_turns`) and scale with it; a policy that ends its games early is faster.
"""

from __future__ import annotations

from sparring.pipeline.config import PipelineConfig

TASK_SECONDS = 4.5  # one task's start-up: process, imports, S3 transfers, MLflow
SFT_SECONDS = 0.085  # per warm-start state and epoch (scripted play and the SFT pass)
ROLLOUT_SECONDS = 0.115  # per self-play game
TRAIN_SECONDS = 0.27  # per self-play game: the GRPO update on its samples
EVAL_SECONDS = 0.06  # per eval game (the warm-started policy ends most games early)
BUDGET = 40 * 8  # max_new_tokens x max_turns the per-game costs were measured at


def eval_games(cfg: PipelineConfig) -> int:
    """Games one evaluation plays: each val state once in self-play, and once per seat
    against the previous checkpoint and the scripted baseline."""
    states = min(cfg.game_init.num_val, cfg.eval.num_games or cfg.game_init.num_val)
    per_state = {"selfplay": 1, "vs_previous": cfg.num_seats, "vs_scripted": cfg.num_seats}
    return states * sum(per_state[mode] for mode in cfg.eval.modes)


def estimate_seconds(cfg: PipelineConfig) -> float | None:
    """Wall seconds of `cfg` on 2 idle CPU cores, or None when it is not the tiny model on
    CPU (no measured costs)."""
    if cfg.model != "tiny" or cfg.device != "cpu" or cfg.train_backend != "torch":
        return None
    budget = cfg.rollout.sampling.max_new_tokens * cfg.game.params.get("max_turns", 8) / BUDGET
    ws = cfg.warm_start
    sft = ws.num_states * cfg.sft_config().epochs * SFT_SECONDS if ws else 0.0
    per_iteration = (
        cfg.games_per_iteration * (ROLLOUT_SECONDS * budget + TRAIN_SECONDS)
        + eval_games(cfg) * EVAL_SECONDS * budget
    )
    tasks = 4 + (ws is not None) + 4 * cfg.iterations  # start, init, model, finish, per iteration
    return tasks * TASK_SECONDS + sft + cfg.iterations * per_iteration
