"""Evaluate a checkpoint on held-out games in three modes, per role.

    sparring evaluate --model runs/iter-2/model --inits runs/inits/val.parquet \
        --previous runs/iter-1/model --out runs/iter-2/eval

Modes (each a batched rollout of the val states):
    selfplay      the model in every seat
    vs_previous   the model against another checkpoint, once in each seat (seats swapped)
    vs_scripted   the model against the game's scripted baseline, once in each seat
                  (Diplomacy: against every scripted bot, see sparring.evaluate_diplomacy)
For every mode and role the model played: mean normalized reward with its standard error,
agreement rate, invalid-action rate (bad actions / attempts), mean turns and mean words.
Metric names: `eval/<mode>/<role>/<metric>` plus `eval/<mode>/all/normalized_reward`.
Writes metrics.json and rewards.png (per mode and role, with error bars).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, Field, model_validator

from sparring.generation.base import SamplingParams
from sparring.rollout import Episode, Policy, RolloutConfig, load_inits, play

MODES = ("selfplay", "vs_previous", "vs_scripted")
# the default scripted opponent per game
SCRIPTED = {"matching": "matching-scripted", "diplomacy": "greedy"}


class EvalConfig(BaseModel):
    """Settings of one evaluation."""

    game: str = "matching"
    game_params: dict[str, Any] = Field(default_factory=dict)
    """Must match the rules the val states were generated with."""
    modes: list[str] = Field(default_factory=lambda: list(MODES))
    """Any of selfplay, vs_previous, vs_scripted (vs_previous is skipped without --previous)."""
    num_games: int | None = Field(None, ge=1)
    """Use the first N val states (None = all)."""
    scripted_agent: str | None = None
    """Opponent for vs_scripted; None = the game's default scripted agent."""
    sampling: SamplingParams = Field(default_factory=lambda: SamplingParams(temperature=0.0))
    """Greedy by default, so evaluations are repeatable."""
    max_batch_size: int = Field(64, ge=1)
    max_context_tokens: int = Field(4096, ge=64)

    @model_validator(mode="after")
    def _check(self) -> EvalConfig:
        unknown = sorted(set(self.modes) - set(MODES))
        if unknown:
            raise ValueError(f"unknown eval modes {unknown}; choose from {list(MODES)}")
        if "vs_scripted" in self.modes and self.opponent is None:
            raise ValueError(f"no default scripted agent for {self.game!r}; set scripted_agent")
        return self

    @property
    def opponent(self) -> str | None:
        return self.scripted_agent or SCRIPTED.get(self.game)


def seat_metrics(episodes: list[Episode], seat: int) -> dict[str, float]:
    """Metrics of the policy that sat in `seat` across `episodes`."""
    rewards = np.array([e.rewards[seat] for e in episodes])
    attempts = sum(sum(1 for t in e.transcript if t["seat"] == seat) for e in episodes)
    return {
        "normalized_reward": float(rewards.mean()),
        "normalized_reward_se": float(rewards.std(ddof=1) / np.sqrt(len(rewards)))
        if len(rewards) > 1
        else 0.0,
        "agreement_rate": float(np.mean([bool(e.outcome.get("agreed")) for e in episodes])),
        "invalid_rate": sum(e.invalid_actions[seat] for e in episodes) / max(attempts, 1),
        "turns": float(np.mean([e.num_turns for e in episodes])),
        "words": float(np.mean([e.words[seat] for e in episodes])),
        "games": float(len(episodes)),
    }


def evaluate(
    policy: Policy,
    inits_path: str | Path,
    cfg: EvalConfig,
    previous: Policy | None = None,
    progress: bool = True,
) -> tuple[dict[str, float], dict[str, list[Episode]]]:
    """Play every mode; return (flat metrics, episodes per mode) for the model's seats."""
    from sparring.agents import make_agent

    inits = load_inits(inits_path, cfg.num_games)
    metrics: dict[str, float] = {}
    episodes: dict[str, list[Episode]] = {}
    for mode in cfg.modes:
        if mode == "vs_previous" and previous is None:
            continue
        if mode == "vs_scripted" and cfg.game == "diplomacy":  # every bot x every country
            from sparring.evaluate_diplomacy import vs_bots

            mode_metrics, episodes[mode] = vs_bots(policy, inits, cfg, progress)
            metrics |= mode_metrics
            continue
        other_name = {"selfplay": "policy", "vs_previous": "previous", "vs_scripted": cfg.opponent}[
            mode
        ]
        policies: dict[str, Policy] = {"policy": policy}
        if mode == "vs_previous":
            policies["previous"] = previous
        elif mode == "vs_scripted":
            policies[other_name] = make_agent(other_name)
        mode_eps: list[Episode] = []
        all_rewards: list[float] = []
        # selfplay: one run, every seat is the model; otherwise one run per model seat.
        for focal in [None] if mode == "selfplay" else range(_num_seats(cfg)):
            seats = None
            if focal is not None:
                seats = [other_name] * _num_seats(cfg)
                seats[focal] = "policy"
            rcfg = RolloutConfig(
                game=cfg.game,
                game_params=cfg.game_params,
                games_per_init=1,
                seats=seats,
                sampling=cfg.sampling,
                max_batch_size=cfg.max_batch_size,
                max_context_tokens=cfg.max_context_tokens,
            )
            eps = play(inits, policies, rcfg, progress=progress).episodes
            mode_eps += eps
            for seat in range(len(eps[0].roles)) if focal is None else [focal]:
                role = eps[0].roles[seat]
                for name, value in seat_metrics(eps, seat).items():
                    metrics[f"eval/{mode}/{role}/{name}"] = value
                all_rewards += [e.rewards[seat] for e in eps]
        metrics[f"eval/{mode}/all/normalized_reward"] = float(np.mean(all_rewards))
        episodes[mode] = mode_eps
    return metrics, episodes


def _num_seats(cfg: EvalConfig) -> int:
    from sparring.games import make_game

    return make_game(cfg.game, **cfg.game_params).num_seats


def plot_rewards(metrics: dict[str, float], path: str | Path, title: str = "eval") -> Path:
    """Bar chart of normalized reward per mode and role, with standard-error bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = sorted(k for k in metrics if k.endswith("/normalized_reward") and "/all/" not in k)
    labels = [k.split("/")[1] + "\n" + k.split("/")[2] for k in keys]
    values = [metrics[k] for k in keys]
    errors = [metrics.get(k + "_se", 0.0) for k in keys]
    fig, ax = plt.subplots(figsize=(max(4, 1.3 * len(keys)), 3.5))
    ax.bar(range(len(keys)), values, yerr=errors, capsize=4, color="tab:blue")
    ax.set_xticks(range(len(keys)), labels, fontsize=8)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("normalized reward")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


def write_eval(
    metrics: dict[str, float], episodes: dict[str, list[Episode]], out_dir: str | Path
) -> dict[str, Path]:
    """Write metrics.json, rewards.png and a few sample transcripts (transcripts.json), plus
    Diplomacy's country_table.md and country_heatmap.png when its per-bot metrics are there."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2, sort_keys=True))
    samples = {
        mode: [
            {
                "game_id": e.game_id,
                "seats": e.seat_policies,
                "rewards": e.rewards,
                "transcript": e.transcript,
            }
            for e in eps[:3]
        ]
        for mode, eps in episodes.items()
    }
    (out / "transcripts.json").write_text(json.dumps(samples, indent=1))
    paths = {
        "metrics": out / "metrics.json",
        "plot": plot_rewards(metrics, out / "rewards.png"),
        "transcripts": out / "transcripts.json",
    }
    if any(k.endswith("/all/reward_mean") for k in metrics):  # Diplomacy's per-bot metrics
        from sparring.evaluate_diplomacy import write_country_report

        paths |= write_country_report(metrics, out)
    return paths


def load_and_evaluate(
    model: str,
    inits_path: str | Path,
    cfg: EvalConfig,
    previous_model: str | None = None,
    device: str = "auto",
    progress: bool = True,
) -> tuple[dict[str, float], dict[str, list[Episode]]]:
    """`evaluate` with checkpoints given as paths (or hub names)."""
    from sparring.generation.hf import HFBackend

    policy = HFBackend(model, device=device, max_batch_size=cfg.max_batch_size)
    previous = (
        HFBackend(previous_model, device=device, max_batch_size=cfg.max_batch_size)
        if previous_model
        else None
    )
    return evaluate(policy, inits_path, cfg, previous, progress)
