"""How long `sparring run` should take: a rough wall-time estimate printed at the start.

Only for models whose costs per unit below were measured on CPU, from per-task times of one run
on 2 idle cores: the tiny model (`make run` in-process on 2x2 matching: 12:46 wall on a CPU
whose matmul probe read 95 GFLOP/s; the costs don't scale with the table, so a 3x3 run takes
about 1.5x its estimate) and SmolLM2-135M-Instruct (the full
`configs/pipeline-smollm2.yaml`: 59:38 wall at 148 GFLOP/s; docs/results.md). Each cost is
scaled to `REFERENCE_MATMUL` by its run's probe.
Another model or a GPU gets no estimate.
The rollout and eval costs are per game at the measured per-turn budget (`max_new_tokens`
times the game's `Game.turn_budget`, matching's `max_turns`) and scale with it; a policy that
ends its games early is faster (SmolLM2's rollout cost is the mean of an untrained and a
once-trained iteration: 2.9 and 1.9 s a game).
`estimate_here` scales the costs by a one-second matmul probe of this machine (a 1.6x slower
CPU made every task 1.4-1.8x slower).
"""

from __future__ import annotations

from typing import NamedTuple

from sparring.evaluate import lineups
from sparring.loop import tasks
from sparring.loop.config import PipelineConfig

REFERENCE_MATMUL = 215e9
"""FLOP/s of a 2048^2 fp32 matmul on 2 threads (`peak_flops.matmul_peak`) on the CPU where
COSTS were measured."""
TASK_SECONDS = 1.5  # one task's share of what is not its compute: S3 transfers, MLflow, setup
# Share of a GRPO update that `bypass_mode` skips, the trainer's old-log-prob pass (13% and
# 21% measured: docs/results.md#what-bypass_mode-saves-in-a-grpo-step); COSTS' train costs
# were measured with the pass.
BYPASS_SAVING = 0.13


class Costs(NamedTuple):
    """Measured seconds per unit of work for one model on 2 CPU cores."""

    sft: float  # per warm-start state and epoch (scripted play and the SFT pass)
    rollout: float  # per self-play game
    train: float  # per self-play game: the GRPO update on its samples
    eval: float  # per eval game
    budget: int  # max_new_tokens x turn budget the per-game costs were measured at


COSTS = {
    "tiny": Costs(sft=0.070, rollout=0.110, train=0.234, eval=0.119, budget=40 * 8),
    # loading and saving the 540 MB checkpoint is inside each task's per-game cost
    "smollm2-135m-instruct": Costs(sft=3.25, rollout=1.65, train=6.3, eval=1.4, budget=48 * 6),
}


def eval_games(cfg: PipelineConfig) -> int:
    """Model games one evaluation plays: each val state once per lineup
    (`sparring.evaluate.lineups`)."""
    states = min(cfg.game_init.num_val, cfg.eval.num_games or cfg.game_init.num_val)
    return states * len(lineups(cfg.eval, previous=True))


def games_on_test(cfg: PipelineConfig) -> int:
    """Model games the test evaluation plays: every test state once per lineup of the champion
    metric's mode (`tasks.test_eval`), for the start and the final model."""
    test = lineups(tasks.test_eval(cfg, baselines=False), previous=True)
    return 2 * cfg.game_init.num_test * len(test)


def estimate_seconds(cfg: PipelineConfig, matmul: float = REFERENCE_MATMUL) -> float | None:
    """Wall seconds of `cfg` on 2 idle CPU cores that multiply matrices at `matmul` FLOP/s, or
    None for a model without measured costs or off CPU."""
    costs = COSTS.get(cfg.model)
    if costs is None or cfg.device != "cpu" or cfg.train_backend != "torch":
        return None
    turns = cfg.game.cls.turn_budget(cfg.game.params)
    budget = cfg.rollout.sampling.max_new_tokens * turns / costs.budget
    ws = cfg.warm_start
    sft = ws.num_states * ws.train.epochs * costs.sft if ws else 0.0
    train = costs.train * (1 - BYPASS_SAVING * cfg.train.bypass_mode)
    per_iteration = (
        cfg.games_per_iteration * (costs.rollout * budget + train)
        + eval_games(cfg) * costs.eval * budget
    )
    once = (cfg.evaluate_start * eval_games(cfg) + games_on_test(cfg)) * costs.eval * budget
    tasks = 4 + (ws is not None) + 4 * cfg.iterations  # start, init, model, finish, per iteration
    tasks += cfg.evaluate_start + (cfg.game_init.num_test > 0)
    seconds = tasks * TASK_SECONDS + sft + cfg.iterations * per_iteration + once
    return seconds * REFERENCE_MATMUL / matmul


def estimate_here(cfg: PipelineConfig) -> tuple[float, float] | None:
    """`estimate_seconds` for this machine, and the matmul FLOP/s its probe measured; None
    where there is no estimate (and then no probe)."""
    if estimate_seconds(cfg) is None:
        return None
    import torch

    from sparring.peak_flops import matmul_peak

    matmul, _ = matmul_peak(torch.device("cpu"), seconds=1.0)
    return estimate_seconds(cfg, matmul), matmul
