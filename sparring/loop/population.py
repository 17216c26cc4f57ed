"""One iteration of a population (`population: {size: K}`, sparring.population) in the loop:
K checkpoints, one per member, played together, each trained on its own seats.

    members = start_members(cfg, run_name, i, model_dir, tmp)  # all the start model, or resumed
    step = iteration(cfg, members, reference, train_inits, val_inits, plan, out, run_name,
                     parent, previous)
    members = step.members                                     # the next iteration's

Steps (the numbers repeat in the body):
  1. rollout: the population state the previous rollout left (its `population.json`, passed
     as `previous` or read from storage: `league.carried`), at a replacement iteration the
     weakest member starting from the strongest's checkpoint; the games seated by
     `plan_seats`, every member a policy of its own; the ratings updated from the games and
     saved in `<i>/rollout/population.json` (with `seat_plan.jsonl`). A retried rollout reads
     the previous state again, so a rating update is never applied twice.
  2. train: one GRPO update per member, on the rows it played (`train.policy` = the member),
     one after another, each from its own start checkpoint (a member with no rows keeps it);
  3. evaluate: every member on the val states, each against its own start (`vs_previous`);
  4. register: every member as its own model version under its own alias (`member-<k>`), the
     lead first (the best rated: its evaluation is the iteration's `eval/*` and its
     checkpoint the iteration's model).

Memory: members are merged checkpoints (with `train.lora_rank` > 0 each update trains LoRA
adapters on the member's weights and merges them, so training holds one model plus one
adapter at a time); the rollout loads each distinct checkpoint once (the engine serves one
model per backend, not several adapters over one base), K models at most, one while every
member still shares the start model. Metrics: `population/<member>/{rating,mu,sigma}`,
`population/<member>/normalized_reward` (its seats in the rollout), its `train/*` and
`eval/*` under the same prefix, and `population/games_rated`.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import NamedTuple

import numpy as np

from sparring import storage
from sparring.loop import league, steps, tasks
from sparring.loop.config import PipelineConfig
from sparring.loop.io import log, run_uri, upload
from sparring.loop.plan import IterationPlan
from sparring.metrics import POPULATION, ROLLOUT, metric_name, prefixed
from sparring.population import Population, plan_seats
from sparring.rollout import build_policies, rollout_stats

STATE_FILE = "population.json"  # the population's state, in each rollout's folder


class PopulationStep(NamedTuple):
    """What one population iteration produced."""

    model_dir: Path  # the lead member's trained checkpoint
    metrics: dict[str, float]  # rollout/*, train/* (mean over members), the lead's eval/*, …
    registered: tasks.Registered  # the lead's version
    val_scores: dict[str, float]  # the lead's champion metric per val game
    members: dict[str, str]  # member -> trained checkpoint: the next iteration's starts


def load(
    cfg: PipelineConfig, run_name: str, iteration: int, previous: str | Path | None
) -> Population:
    """The population state rollout `iteration` continues (new without one), with the current
    settings (`replace_every`, `roles`); ValueError if it holds other members."""
    assert cfg.population is not None
    state = league.carried(cfg, run_name, iteration, previous, STATE_FILE)
    if not state:
        return Population(cfg.population)
    population = Population.from_dict(state)
    if sorted(population.ratings) != sorted(cfg.population.members):
        raise ValueError(
            f"the stored population of run {run_name} has members {sorted(population.ratings)}, "
            f"this config {cfg.population.members}: keep population.size, or start a new run"
        )
    population.cfg = cfg.population
    return population


def member_uri(cfg: PipelineConfig, run_name: str, iteration: int, member: str) -> str:
    """Where `register` stores a member's checkpoint with tracking off."""
    return run_uri(cfg, run_name, iteration, "members", member, "checkpoint")


def start_members(
    cfg: PipelineConfig, run_name: str, iteration: int, model_dir: str, tmp: str | Path
) -> dict[str, str]:
    """The members' checkpoints rollout `iteration` starts from: those iteration - 1 of this
    run registered, downloaded into `tmp`, when the run stored a population state there (a
    resumed campaign block); else `model_dir` for every member."""
    assert cfg.population is not None
    names = cfg.population.members
    if not league.carried(cfg, run_name, iteration, None, STATE_FILE):
        return dict.fromkeys(names, model_dir)
    from sparring.registry import stored_checkpoint
    from sparring.tracking import connect

    client = connect(cfg.tracking) if cfg.tracking.enabled else None
    members = {}
    for m in names:
        uri = member_uri(cfg, run_name, iteration - 1, m)
        if client is not None:
            uri = stored_checkpoint(cfg.registered_model, run_name, iteration - 1, client, m)
        members[m] = str(storage.download_dir(uri, Path(tmp) / m, cfg.storage.client_config()))
        log(f"iteration {iteration}: {m} resumes from {uri}")
    return members


def rollout(
    cfg: PipelineConfig,
    members: dict[str, str],
    train_inits: str,
    iteration: int,
    games: int,
    out_dir: str | Path,
    run_name: str,
    previous: str | Path | None = None,
) -> tuple[dict[str, float], dict[str, str]]:
    """1. Play the iteration's games with the population seated, rate the members, save the
    state; returns (metrics, member -> the checkpoint it played and now trains from)."""
    assert cfg.population is not None
    population = load(cfg, run_name, iteration, previous)
    sources = population.replace(iteration)
    for weakest, strongest in sources.items():
        log(f"iteration {iteration}: {weakest} (weakest) takes a copy of {strongest} (strongest)")
    starts = {m: members[sources.get(m, m)] for m in members}
    states, rcfg = tasks.iteration_plan(cfg, train_inits, iteration, games)
    names = cfg.population.members
    plan = plan_seats(len(states), cfg.game.cls.roles, cfg.population, seed=iteration)
    policies = build_policies(
        cfg.game, None, names, cfg.device, rcfg.max_batch_size, extra_models=starts
    )
    played = steps.self_play(states, policies, rcfg, out_dir, plan, learners=names)
    episodes = played.result.episodes
    rated = population.update(iteration, episodes)
    stats = played.metrics | population.metrics()
    stats[metric_name(POPULATION, "games_rated")] = float(rated)
    reward = metric_name(ROLLOUT, "normalized_reward")
    for m in names:
        own = rollout_stats(played.result, m)[reward]
        stats[metric_name(POPULATION, m, "normalized_reward")] = own
    out = Path(out_dir)
    (out / STATE_FILE).write_text(json.dumps(population.to_dict(), indent=1))
    with open(out / "seat_plan.jsonl", "w") as f:
        for (init_id, _), seats in zip(states, plan, strict=True):
            f.write(json.dumps({"iteration": iteration, "init_id": init_id, "seats": seats}) + "\n")
    (out / "stats.json").write_text(json.dumps(stats, indent=2))
    upload(cfg, out, run_uri(cfg, run_name, iteration, "rollout"))
    ratings = ", ".join(f"{m} {population.ordinal(m):.2f}" for m in population.ranking())
    log(f"iteration {iteration}: rollout reward {stats[reward]:.3f}; ratings {ratings}")
    return stats, starts


def train(
    cfg: PipelineConfig,
    starts: dict[str, str],
    samples: str | Path,
    out_dir: str | Path,
    reference: str,
    iteration: int,
) -> tuple[dict[str, float], dict[str, str]]:
    """2. One GRPO update per member on the rows it played, into `out_dir/<member>`; returns
    (each metric as the mean over the members, seconds summed, and each member's under
    `population/<member>/`; member -> trained checkpoint)."""
    import pandas as pd

    played = pd.read_parquet(samples, columns=["policy"]).policy.value_counts()
    metrics: dict[str, float] = {}
    per_member: list[dict[str, float]] = []
    trained = {}
    for m, start in starts.items():
        out = Path(out_dir) / m
        if not played.get(m, 0):  # never seated: nothing to learn from
            shutil.copytree(start, out, dirs_exist_ok=True)
            own = {"train/no_signal": 1.0, "perf/train_seconds": 0.0}
        else:
            mcfg = cfg.model_copy(update={"train": cfg.train.model_copy(update={"policy": m})})
            own = tasks.train(mcfg, start, str(samples), out, reference, None, iteration)
        per_member.append(own)
        metrics |= prefixed(metric_name(POPULATION, m), own)
        trained[m] = str(out)
    for key in sorted({k for own in per_member for k in own}):
        values = [own[key] for own in per_member if key in own]
        metrics[key] = float(np.sum(values) if key.endswith("_seconds") else np.mean(values))
    return metrics, trained


def iteration(
    cfg: PipelineConfig,
    members: dict[str, str],
    reference: str,
    train_inits: str,
    val_inits: str,
    step: IterationPlan,
    out: Path,
    run_name: str,
    parent: str,
    previous: str | Path | None = None,
) -> PopulationStep:
    """Steps 1-4 of one iteration (see the module docstring); files under `out`."""
    i = step.iteration
    # 1. rollout
    metrics, starts = rollout(
        cfg, members, train_inits, i, step.games, out / "rollout", run_name, previous
    )
    # 2. train
    samples = out / "rollout" / "samples.parquet"
    trained_metrics, trained = train(cfg, starts, samples, out / "trained", reference, i)
    metrics |= trained_metrics
    # 3. evaluate
    evals, scores = {}, {}
    for m, model in trained.items():
        eval_dir = out / "eval" / m
        evals[m], _ = tasks.evaluate(
            cfg, model, starts[m], val_inits, eval_dir, run_name, i, member=m
        )
        scores[m] = tasks.load_scores(eval_dir)
        metrics |= prefixed(metric_name(POPULATION, m), evals[m])
    rated = Population.from_dict(json.loads((out / "rollout" / STATE_FILE).read_text()))
    lead, *rest = rated.ranking()
    metrics |= evals[lead]
    # 4. register, the lead first (with the iteration's metrics), then the others
    registered = {}
    for m in [lead, *rest]:
        registered[m] = tasks.register(
            cfg, parent, run_name, i, trained[m], metrics if m == lead else evals[m],
            scores=scores[m], member=m, curve=m == lead,
        )  # fmt: skip
    return PopulationStep(Path(trained[lead]), metrics, registered[lead], scores[lead], trained)
