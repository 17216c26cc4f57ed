"""Evaluate a checkpoint on held-out games, per mode and role.

    sparring evaluate --model runs/iter-2/model --inits runs/inits/val.parquet \\
        --previous runs/iter-1/model --out runs/iter-2/eval

Modes:
    selfplay      the model in every seat
    vs_previous   the model against another checkpoint, once in each seat
    vs_scripted   the model against the game's scripted baseline, once in each seat
A game declares the seatings (`Lineup`s) of each mode (`Game.eval_lineups`), and may add modes
(Diplomacy plays every bot as `vs_<bot>`); every val state is played once per lineup, all in
ONE batched rollout. For every mode and role the model played: `sparring.rollout.play_metrics`
(mean normalized reward with its standard error, invalid rate, mean turns and words, games, and
the game's own, e.g. matching's agreement rate).
Metric names: `eval/<mode>/<role>/<metric>` plus `eval/<mode>/all/normalized_reward`, and
`eval/<name>` for what the game reads from the model itself (`Game.policy_metrics`: Kuhn
Poker's `eval/exploitability`). Beside them, the game's baselines on the same states
(`Game.baselines`): `eval/baseline/<name>` and `eval/gain_over_best_trivial`, the model's
reward minus the best trivial baseline's.
Writes metrics.json, rewards.png (per mode and role, then the baselines, with error bars) and
the game's own report files (`Game.write_report`).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from sparring.games import GameSpec
from sparring.games.base import LEARNER, PREVIOUS, Baseline, Lineup
from sparring.generation.base import SamplingParams
from sparring.metrics import (
    ALL_ROLES,
    BASELINE,
    EVAL,
    EVAL_MODES,
    GAIN_OVER_BEST_TRIVIAL,
    VS_PREVIOUS,
    baseline_name,
    eval_name,
    metric_name,
    prefixed,
    split_baseline,
    split_eval,
)
from sparring.rollout import (
    Episode,
    Policy,
    RolloutConfig,
    by_role,
    learner_plays,
    load_inits,
    play,
    play_games,
    play_metrics,
)

MODES = EVAL_MODES


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
    breakdown: bool = True
    """Also play the lineups a game adds to a mode (Diplomacy: the learner against each other
    bot, `vs_<bot>`); false plays only the modes' own (the test step's choice)."""
    baselines: bool = True
    """Play the game's baselines on the same states (`eval/baseline/*`)."""

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


def lineups(cfg: EvalConfig, previous: bool) -> list[Lineup]:
    """Every seating `cfg.modes` plays (`vs_previous` only given a `previous` checkpoint; the
    game's added lineups only with `cfg.breakdown`)."""
    modes = [m for m in cfg.modes if previous or m != VS_PREVIOUS]
    plan = [x for m in modes for x in cfg.game.cls.eval_lineups(m, cfg.opponent)]
    return plan if cfg.breakdown else [x for x in plan if x.mode in modes]


def evaluate(
    policy: Policy,
    inits_path: str | Path,
    cfg: EvalConfig,
    previous: Policy | None = None,
    progress: bool = True,
) -> tuple[dict[str, float], dict[str, list[Episode]]]:
    """Play every lineup of every mode on every val state in one batched rollout, together
    with the game's played baselines (`Game.baselines`) in the learner's seats of their mode;
    return (flat metrics, the model's episodes per mode). Game ids are
    `<init>/<mode or baseline>/<opponent>/<seat>#0`."""
    inits = load_inits(inits_path, cfg.num_games)
    game, roles = cfg.game.cls, cfg.game.cls.roles
    plan = lineups(cfg, previous is not None)
    modes = {x.mode for x in plan}
    baselines = [b for b in game.baselines() if b.mode in modes] if cfg.baselines else []
    # (group, lineup, seats): the model's lineups, then each played baseline in its mode's
    # lineups with its agent in the learner's seats
    tables = [(x.mode, x, x.seats) for x in plan] + [
        (b.name, x, tuple(b.agent if p == LEARNER else p for p in x.seats))
        for b in baselines
        if b.agent
        for x in plan
        if x.mode == b.mode
    ]
    policies: dict[str, Policy] = {LEARNER: policy}
    if previous is not None:
        policies[PREVIOUS] = previous
    for agent in {p for *_, seats in tables for p in seats} - set(policies):
        policies[agent] = cfg.game.make_agent(agent)
    games = [(t, init_id, state) for t in tables for init_id, state in inits]
    runs = [(f"{i}/{group}/{_label(x.seats, roles)}", st) for (group, x, _), i, st in games]
    seats = [list(s) for (*_, s), *_ in games]
    played = play(runs, policies, cfg.mode_rollout(None), progress, seat_plan=seats).episodes
    episodes: dict[str, list[Episode]] = {}
    by_state: dict[str, dict[str, list[float]]] = {}  # group -> init id -> learner seats' rewards
    for ((group, x, _), init_id, _), ep in zip(games, played, strict=True):
        if group in modes:
            episodes.setdefault(group, []).append(ep)
        mine = by_state.setdefault(group, {}).setdefault(init_id, [])
        mine += [ep.rewards[s] for s, p in enumerate(x.seats) if p == LEARNER]
    for b in baselines:
        if b.value is not None:
            by_state[b.name] = {init_id: [b.value(state)] for init_id, state in inits}
    metrics: dict[str, float] = {}
    for mode, eps in episodes.items():
        plays = learner_plays(eps)
        for role, role_plays in by_role(plays).items():
            metrics |= prefixed(metric_name(EVAL, mode, role), play_metrics(game, role_plays))
        rewards = [e.rewards[s] for e, s in plays]
        metrics[eval_name(mode, ALL_ROLES, "normalized_reward")] = float(np.mean(rewards))
    metrics |= prefixed(
        EVAL, cfg.game.make().policy_metrics(policy, cfg.rollout.sampling.temperature, play_games)
    )
    return metrics | baseline_metrics(baselines, by_state), episodes


def baseline_metrics(
    baselines: list[Baseline], by_state: dict[str, dict[str, list[float]]]
) -> dict[str, float]:
    """`eval/baseline/<name>` (mean reward over states, with its standard error) and
    `eval/gain_over_best_trivial`: the model's reward in the trivial baselines' modes minus the
    best trivial baseline's, with its paired standard error over states. `by_state` maps each
    mode and baseline name to its rewards per state."""

    def per_state(group: str) -> np.ndarray:
        return np.array([np.mean(r) for r in by_state[group].values()])

    metrics, gains = {}, []
    for b in baselines:
        base = per_state(b.name)
        metrics[baseline_name(b.name)] = float(base.mean())
        metrics[baseline_name(b.name) + "_se"] = _se(base)
        if b.trivial:
            gains.append(per_state(b.mode) - base)
    if gains:
        gain = min(gains, key=np.mean)
        metrics[metric_name(EVAL, GAIN_OVER_BEST_TRIVIAL)] = float(gain.mean())
        metrics[metric_name(EVAL, GAIN_OVER_BEST_TRIVIAL + "_se")] = _se(gain)
    return metrics


def headline(metrics: dict[str, float]) -> dict[str, float]:
    """The figures to read first: the model's reward per mode and role, then every baseline's
    and the gain over the best trivial one, with their standard errors."""
    gain = metric_name(EVAL, GAIN_OVER_BEST_TRIVIAL)
    return {
        k: v
        for k, v in metrics.items()
        if ((p := split_eval(k)) and p[2].startswith("normalized_reward"))
        or k.startswith((baseline_name(""), gain))
    }


def _se(values: np.ndarray) -> float:
    """Standard error of the mean (0 for a single value)."""
    return float(values.std(ddof=1) / np.sqrt(len(values))) if len(values) > 1 else 0.0


def _label(seats: tuple[str, ...], roles: tuple[str, ...]) -> str:
    """`<opponent>/<the learner's role>` of a lineup (`policy/all` in self-play)."""
    mine = [r for r, p in zip(roles, seats, strict=True) if p == LEARNER]
    others = sorted({p for p in seats if p != LEARNER})
    where = ALL_ROLES if len(mine) == len(roles) else "+".join(mine)
    return f"{'+'.join(others) or LEARNER}/{where}"


def plot_rewards(metrics: dict[str, float], path: str | Path, title: str = "eval") -> Path:
    """Bar chart of normalized reward per mode and role, then the game's baselines (grey),
    with standard-error bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = sorted(
        k
        for k in metrics
        if (p := split_eval(k)) and p[2] == "normalized_reward" and p[1] != ALL_ROLES
    )
    baselines = sorted(k for k in metrics if split_baseline(k))
    labels = ["\n".join(split_eval(k)[:2]) for k in keys]
    labels += [f"{BASELINE}\n{split_baseline(k)}" for k in baselines]
    values = [metrics[k] for k in keys + baselines]
    errors = [metrics.get(k + "_se", 0.0) for k in keys + baselines]
    colors = ["tab:blue"] * len(keys) + ["tab:gray"] * len(baselines)
    fig, ax = plt.subplots(figsize=(max(4, 1.3 * len(labels)), 3.5))
    ax.bar(range(len(labels)), values, yerr=errors, capsize=4, color=colors)
    ax.set_xticks(range(len(labels)), labels, fontsize=8)
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
    """`evaluate` with checkpoints given as paths (or hub names), on `cfg.rollout.backend`."""
    from sparring.generation.factory import make_backend

    batch = cfg.rollout.max_batch_size
    policy = make_backend(model, cfg.rollout.backend, device, batch)
    previous = (
        make_backend(previous_model, cfg.rollout.backend, device, batch) if previous_model else None
    )
    return evaluate(policy, inits_path, cfg, previous, progress)
