"""The loop's three steps (warm start, self-play, one GRPO update), which its tasks run.

    warm = warm_start(model, rcfg, "matching-scripted", states, work / "warm", SFTConfig())
    model = warm.model_dir
    for i in range(iterations):
        policies = build_policies(rcfg.game, model, rcfg.seats)
        played = self_play(rotate(states, i, n), policies, rcfg, work / f"{i}/rollout")
        model = grpo_step(model, played.paths["samples"], work / f"{i}/model", gcfg).model_dir

1. warm start: the game's scripted agent plays every seat; its replies, tokenized with the
   model's own chat template, are the SFT data (optional; a pretrained instruct model may
   play well enough without it);
2. self-play: a batched rollout of the iteration's train states, written as games.jsonl,
   samples.parquet and stats.json (with dynamic sampling's `min_groups`, topped up with further
   states until enough groups carry signal: `TopUp`);
3. GRPO: one update on the samples. When every group's rewards tie there is no gradient, so
   the checkpoint is copied unchanged and `train/no_signal` is 1.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sparring.games.base import LEARNER
from sparring.metrics import ROLLOUT, WARM_START, metric_name
from sparring.rollout import (
    Learners,
    Policy,
    RolloutConfig,
    RolloutResult,
    play,
    rollout_stats,
    write_outputs,
)
from sparring.train_config import GRPOConfig, SFTConfig


@dataclass
class Step:
    """What one recipe step produced: its output folder, files and metrics."""

    out_dir: Path
    metrics: dict[str, float] = field(default_factory=dict)
    paths: dict[str, Path] = field(default_factory=dict)
    result: RolloutResult | None = None  # the rollout's episodes (self-play steps only)


def rotate(states: list[Any], iteration: int, n: int) -> list[Any]:
    """The `n` states of `iteration`: consecutive windows of `states`, wrapping around, so
    successive iterations see fresh states until the list is used up."""
    return [states[(iteration * n + j) % len(states)] for j in range(n)]


def warm_start(
    model_dir: str | Path,
    rcfg: RolloutConfig,
    agent: str,
    states: list[tuple[str, dict[str, Any]]],
    out_dir: str | Path,
    cfg: SFTConfig | None = None,
    device: str = "auto",
) -> Step:
    """1. SFT `model_dir` on `agent` playing every seat of `states` once; a checkpoint in
    `out_dir`, with `warm_start/teacher_reward` (the scripted games' mean reward). The
    scripted games are kept only while training."""
    import tempfile

    from transformers import AutoTokenizer

    from sparring.sft import sft

    seats = [agent] * len(rcfg.game.cls.roles)
    scripted = rcfg.model_copy(update={"seats": seats, "games_per_init": 1})
    result = play(
        states,
        {agent: rcfg.game.make_agent(agent)},
        scripted,
        progress=False,
        scripted_tokenizer=AutoTokenizer.from_pretrained(model_dir),
    )
    teacher = rollout_stats(result, learner=agent)[metric_name(ROLLOUT, "normalized_reward")]
    with tempfile.TemporaryDirectory(prefix="sparring-sft-") as tmp:
        samples = write_outputs(result, tmp)["samples"]
        trained = sft(model_dir, [samples], out_dir, cfg, device)
    return Step(
        trained.out_dir, {**trained.metrics, metric_name(WARM_START, "teacher_reward"): teacher}
    )


def self_play(
    states: list[tuple[str, dict[str, Any]]],
    policies: dict[str, Policy],
    rcfg: RolloutConfig,
    out_dir: str | Path,
    seat_plan: list[list[str]] | None = None,
    progress: bool = False,
    top_up: TopUp | None = None,
    learners: Learners = LEARNER,
) -> Step:
    """2. Play `states` (`rcfg.games_per_init` times each), then `top_up`'s further states
    where dynamic sampling asks for them (no opponent mix); write and summarise the games, all
    of them, over the seats of `learners` (a population's members)."""
    result = play(states, policies, rcfg, progress=progress, seat_plan=seat_plan)
    extra: dict[str, float] = {}
    if top_up is not None:
        result, extra = top_up.play(result, len(states), policies, rcfg, progress)
    paths = write_outputs(result, out_dir)
    return Step(Path(out_dir), rollout_stats(result, learners) | extra, paths, result)


@dataclass
class TopUp:
    """Dynamic sampling's top-up (DAPO): while fewer than `cfg.min_groups` groups of the
    samples carry signal (`sparring.train.signal_groups`, counted as the update will), play
    the next round of `spare` train states, as many as the iteration's own, seated as the
    rollout's own games (no opponent mix). `spare` holds at most `cfg.max_topup_rounds` rounds."""

    cfg: GRPOConfig
    spare: list[tuple[str, dict[str, Any]]]

    def play(
        self,
        result: RolloutResult,
        round_size: int,
        policies: dict[str, Policy],
        rcfg: RolloutConfig,
        progress: bool = False,
    ) -> tuple[RolloutResult, dict[str, float]]:
        """`result` with the rounds it took added, and `rollout/signal_groups`,
        `rollout/topup_rounds` and `rollout/topup_games`."""
        import pandas as pd

        from sparring.train import signal_groups

        spare, rounds, games = list(self.spare), 0, len(result.episodes)
        have = signal_groups(pd.DataFrame(result.samples), self.cfg)
        while have < self.cfg.min_groups and spare:
            more, spare = spare[:round_size], spare[round_size:]
            result = _merged(result, play(more, policies, rcfg, progress=progress))
            rounds += 1
            have = signal_groups(pd.DataFrame(result.samples), self.cfg)
        metrics = {"signal_groups": have, "topup_rounds": rounds}
        metrics["topup_games"] = len(result.episodes) - games
        return result, {metric_name(ROLLOUT, k): float(v) for k, v in metrics.items()}


def _merged(a: RolloutResult, b: RolloutResult) -> RolloutResult:
    """Two rollouts of the same policies as one (`b` later: the backends' token counters, which
    `generated_tokens` reads, run on from `a`)."""
    return RolloutResult(
        a.episodes + b.episodes,
        a.samples + b.samples,
        a.seconds + b.seconds,
        a.generate_calls + b.generate_calls,
        b.generated_tokens,
    )


def grpo_step(
    model_dir: str | Path,
    samples: str | Path,
    out_dir: str | Path,
    cfg: GRPOConfig | None = None,
    ref_model_dir: str | Path | None = None,
    on_step: Any = None,  # sparring.train.OnStep: each optimizer step's metrics, live
    device: str = "auto",
    optimizer_in: str | Path | None = None,
    optimizer_out: str | Path | None = None,
    update: int = 0,
) -> Step:
    """3. One GRPO update (the run's `update`-th); on no signal the checkpoint (and optimizer
    state) are copied unchanged."""
    from sparring.train import NoSignalError, train

    ref = ref_model_dir if cfg is not None and cfg.kl_coef > 0 else None
    try:
        stats = train(
            model_dir, [samples], out_dir, cfg, ref, on_step, device, optimizer_in, optimizer_out,
            update,
        )  # fmt: skip
    except NoSignalError as err:  # every group tied: no gradient, so the policy stays as it was
        print(f"[sparring] train: no learning signal, checkpoint unchanged ({err})", flush=True)
        shutil.copytree(model_dir, out_dir, dirs_exist_ok=True)
        if optimizer_in and optimizer_out and Path(optimizer_in).is_dir():
            shutil.copytree(optimizer_in, optimizer_out, dirs_exist_ok=True)
        return Step(Path(out_dir), {"train/no_signal": 1.0, "perf/train_seconds": 0.0})
    return Step(stats.out_dir, {**stats.metrics, "train/no_signal": 0.0})
