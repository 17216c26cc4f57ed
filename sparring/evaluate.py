"""Evaluate a checkpoint on held-out games in three modes, per role.

    sparring evaluate --model runs/iter-2/model --inits runs/inits/val.parquet \\
        --previous runs/iter-1/model --out runs/iter-2/eval

Modes (each a batched rollout of the val states):
    selfplay      the model in every seat
    vs_previous   the model against another checkpoint, once in each seat (seats swapped)
    vs_scripted   the model against the game's scripted baseline, once in each seat (or the
                  game's own `Game.scripted_eval`, e.g. every bot in every seat)
For every mode and role the model played: mean normalized reward with its standard error,
agreement rate, invalid rate (turns with an invalid action / turns attempted), mean turns
and mean words.
Metric names: `eval/<mode>/<role>/<metric>` plus `eval/<mode>/all/normalized_reward`.
Writes metrics.json, rewards.png (per mode and role, with error bars) and the game's own
report files (`Game.write_report`).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from sparring.games import GameSpec
from sparring.games.base import LEARNER
from sparring.generation.base import SamplingParams
from sparring.rollout import Episode, Policy, RolloutConfig, load_inits, play

MODES = ("selfplay", "vs_previous", "vs_scripted")


def _greedy_rollout() -> RolloutConfig:
    return RolloutConfig(games_per_init=1, sampling=SamplingParams(temperature=0.0))


class EvalConfig(BaseModel):
    """Settings of one evaluation: which modes, how many val states, and the rollout they use."""

    model_config = ConfigDict(extra="forbid")

    rollout: RolloutConfig = Field(default_factory=_greedy_rollout)
    """Game, sampling and batching of the eval games (greedy by default, so evaluations are
    repeatable; `games_per_init` and `seats` are set per mode)."""
    modes: list[str] = Field(default_factory=lambda: list(MODES))
    """Any of selfplay, vs_previous, vs_scripted (vs_previous is skipped without --previous)."""
    num_games: int | None = Field(None, ge=1)
    """Use the first N val states (None = all)."""
    scripted_agent: str | None = None
    """Opponent for vs_scripted; None = the game's `default_opponent`."""

    @model_validator(mode="after")
    def _check(self) -> EvalConfig:
        unknown = sorted(set(self.modes) - set(MODES))
        if unknown:
            raise ValueError(f"unknown eval modes {unknown}; choose from {list(MODES)}")
        if "vs_scripted" in self.modes and self.opponent is None:
            raise ValueError(
                f"no default scripted agent for {self.game.name!r}; set scripted_agent"
            )
        return self

    @property
    def game(self) -> GameSpec:
        return self.rollout.game

    @property
    def opponent(self) -> str | None:
        return self.scripted_agent or self.game.cls.default_opponent

    def mode_rollout(self, seats: list[str] | None) -> RolloutConfig:
        """The rollout config of one eval run: every val state once, with these seats."""
        return self.rollout.model_copy(update={"games_per_init": 1, "seats": seats})


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
    inits = load_inits(inits_path, cfg.num_games)
    metrics: dict[str, float] = {}
    episodes: dict[str, list[Episode]] = {}
    for mode in cfg.modes:
        if mode == "vs_previous" and previous is None:
            continue
        if mode == "vs_scripted":
            custom = cfg.game.cls.scripted_eval(policy, inits, cfg, progress)
            if custom is not None:
                metrics |= custom[0]
                episodes[mode] = custom[1]
                continue
        other_name = {"selfplay": LEARNER, "vs_previous": "previous", "vs_scripted": cfg.opponent}[
            mode
        ]
        policies: dict[str, Policy] = {LEARNER: policy}
        if mode == "vs_previous":
            policies["previous"] = previous
        elif mode == "vs_scripted":
            policies[other_name] = cfg.game.make_agent(other_name)
        mode_eps: list[Episode] = []
        all_rewards: list[float] = []
        # selfplay: one run, every seat is the model; otherwise one run per model seat.
        num_seats = len(cfg.game.cls.roles)
        for focal in [None] if mode == "selfplay" else range(num_seats):
            seats = None
            if focal is not None:
                seats = [other_name] * num_seats
                seats[focal] = LEARNER
            eps = play(inits, policies, cfg.mode_rollout(seats), progress=progress).episodes
            mode_eps += eps
            for seat in range(len(eps[0].roles)) if focal is None else [focal]:
                role = eps[0].roles[seat]
                for name, value in seat_metrics(eps, seat).items():
                    metrics[f"eval/{mode}/{role}/{name}"] = value
                all_rewards += [e.rewards[seat] for e in eps]
        metrics[f"eval/{mode}/all/normalized_reward"] = float(np.mean(all_rewards))
        episodes[mode] = mode_eps
    return metrics, episodes


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
    metrics: dict[str, float],
    episodes: dict[str, list[Episode]],
    out_dir: str | Path,
    game: GameSpec | None = None,
) -> dict[str, Path]:
    """Write metrics.json, every game's rewards per mode (rewards.json: game_id and one reward
    per seat, in play order), rewards.png, a few sample transcripts (transcripts.json) and,
    given the `game`, its own report files (`Game.write_report`)."""
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
    rewards = {
        mode: [{"game_id": e.game_id, "rewards": e.rewards} for e in eps]
        for mode, eps in episodes.items()
    }
    (out / "rewards.json").write_text(json.dumps(rewards))
    paths = {
        "metrics": out / "metrics.json",
        "rewards": out / "rewards.json",
        "plot": plot_rewards(metrics, out / "rewards.png"),
        "transcripts": out / "transcripts.json",
    }
    if game is not None:
        paths |= game.cls.write_report(metrics, out)
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

    batch = cfg.rollout.max_batch_size
    policy = HFBackend(model, device=device, max_batch_size=batch)
    previous = (
        HFBackend(previous_model, device=device, max_batch_size=batch) if previous_model else None
    )
    return evaluate(policy, inits_path, cfg, previous, progress)
