"""One iteration of a population (`population: {size: K}`, sparring.population) in the loop:
K checkpoints, one per member, played together, each trained on its own seats.

    members = start_members(cfg, run_name, i, model_dir, tmp)  # all the start model, or resumed
    step = iteration(cfg, members, reference, train_inits, val_inits, plan, out, run_name,
                     parent, previous)
    members = step.members                                     # the next iteration's

`iteration` is the in-process loop's (sparring.loop.runner); the KFP graph calls its stages as
tasks (components/population.py): `rollout`, then per member `train_member` and
`tasks.evaluate`, then `register` with `ranking` and `iteration_metrics`, so both play the
same games and reach the same ratings.

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

import contextlib
import json
import shutil
from pathlib import Path
from typing import NamedTuple

import numpy as np

from sparring import heap, storage
from sparring.loop import checkpoints, league, steps, tasks
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
    cfg: PipelineConfig,
    run_name: str,
    iteration: int,
    model_dir: str,
    tmp: str | Path,
    download: bool = True,
) -> dict[str, str]:
    """The members' checkpoints rollout `iteration` starts from: those iteration - 1 of this
    run registered, downloaded into `tmp` (without `download`, referenced there instead, as a
    KFP task's checkpoint artifacts: sparring.loop.checkpoints), when the run stored a
    population state there (a resumed campaign block); else `model_dir` for every member."""
    assert cfg.population is not None
    names = cfg.population.members
    if not league.carried(cfg, run_name, iteration, None, STATE_FILE):
        return dict.fromkeys(names, model_dir)
    from sparring.registry import stored_checkpoint
    from sparring.tracking import connect

    client = connect(cfg.tracking) if cfg.tracking.enabled else None
    config, members = cfg.storage.client_config(), {}
    for m in names:
        uri = member_uri(cfg, run_name, iteration - 1, m)
        if client is not None:
            uri = stored_checkpoint(cfg.registered_model, run_name, iteration - 1, client, m)
        folder = Path(tmp) / m
        if download:
            storage.download_dir(uri, folder, config)
        else:
            checkpoints.write(folder, uri, storage.verify(uri, config))
        members[m] = str(folder)
        log(f"iteration {iteration}: {m} resumes from {uri}")
    return members


@heap.releases_memory
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
    state; returns (metrics, member -> the checkpoint it played and now trains from). A
    member's checkpoint is a HF folder or a KFP checkpoint artifact (downloaded while it
    plays: sparring.loop.checkpoints.local); the returned ones are among `members`' values."""
    assert cfg.population is not None
    population = load(cfg, run_name, iteration, previous)
    sources = population.replace(iteration)
    for weakest, strongest in sources.items():
        log(f"iteration {iteration}: {weakest} (weakest) takes a copy of {strongest} (strongest)")
    starts = {m: members[sources.get(m, m)] for m in members}
    states, rcfg = tasks.iteration_plan(cfg, train_inits, iteration, games)
    names = cfg.population.members
    plan = plan_seats(len(states), cfg.game.cls.roles, cfg.population, seed=iteration)
    with contextlib.ExitStack() as stack:  # each distinct checkpoint once, K at most
        local = {
            c: stack.enter_context(checkpoints.local(c, cfg))
            for c in dict.fromkeys(starts.values())
        }
        policies = build_policies(
            cfg.game, None, names, cfg.device, rcfg.max_batch_size,
            extra_models={m: local[c] for m, c in starts.items()},
        )  # fmt: skip
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


def train_member(
    cfg: PipelineConfig,
    member: str,
    start: str,
    samples: str | Path,
    out_dir: str | Path,
    reference: str | None,
    iteration: int,
) -> dict[str, float]:
    """2. One member's GRPO update from `start` on the rows it played (`train.policy` = the
    member) into `out_dir`; a member seated nowhere keeps its start (copied). Its train/* and
    perf/* metrics."""
    import pandas as pd

    played = pd.read_parquet(samples, columns=["policy"]).policy
    if not (played == member).any():  # never seated: nothing to learn from
        shutil.copytree(start, out_dir, dirs_exist_ok=True)
        return {"train/no_signal": 1.0, "perf/train_seconds": 0.0}
    mcfg = cfg.model_copy(update={"train": cfg.train.model_copy(update={"policy": member})})
    return tasks.train(mcfg, start, str(samples), out_dir, reference, None, iteration)


def ranking(state: str | Path) -> list[str]:
    """The members strongest first, by the ratings a rollout saved (its `population.json`):
    the first is the iteration's lead."""
    return Population.from_dict(json.loads(Path(state).read_text())).ranking()


def iteration_metrics(
    rollout: dict[str, float],
    trained: dict[str, dict[str, float]],
    evals: dict[str, dict[str, float]],
    lead: str,
) -> dict[str, float]:
    """The iteration's metrics from the rollout's, each member's train/* and eval/*: those
    under `population/<member>/`, each train metric as the mean over the members (seconds
    summed), and the lead's eval/* as the iteration's."""
    metrics = dict(rollout)
    for m, own in trained.items():
        metrics |= prefixed(metric_name(POPULATION, m), own)
    for key in sorted({k for own in trained.values() for k in own}):
        values = [own[key] for own in trained.values() if key in own]
        metrics[key] = float(np.sum(values) if key.endswith("_seconds") else np.mean(values))
    for m, own in evals.items():
        metrics |= prefixed(metric_name(POPULATION, m), own)
    return metrics | evals[lead]


def register(
    cfg: PipelineConfig,
    parent: str,
    run_name: str,
    iteration: int,
    trained: dict[str, str],
    metrics: dict[str, float],
    evals: dict[str, dict[str, float]],
    scores: dict[str, dict[str, float]],
    ranked: list[str],
    artifacts: list[str | Path] = (),  # type: ignore[assignment]
    kfp_run_id: str | None = None,
) -> dict[str, tasks.Registered]:
    """4. Register every member in `ranked` order, under its own alias: the lead first, with
    the iteration's `metrics` (and `artifacts`) and on the parent run's curve, then the others
    with their own eval/*."""
    lead, registered = ranked[0], {}
    for m in ranked:
        registered[m] = tasks.register(
            cfg, parent, run_name, iteration, trained[m], metrics if m == lead else evals[m],
            artifacts if m == lead else [], kfp_run_id, scores=scores[m], member=m,
            curve=m == lead,
        )  # fmt: skip
    return registered


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
    i, state = step.iteration, out / "rollout" / STATE_FILE
    # 1. rollout
    stats, starts = rollout(
        cfg, members, train_inits, i, step.games, out / "rollout", run_name, previous
    )
    # 2. train, one member after another
    samples, trained, train_stats = out / "rollout" / "samples.parquet", {}, {}
    for m, start in starts.items():
        trained[m] = str(out / "trained" / m)
        train_stats[m] = train_member(cfg, m, start, samples, trained[m], reference, i)
    # 3. evaluate
    evals, scores = {}, {}
    for m, model in trained.items():
        eval_dir = out / "eval" / m
        evals[m], _ = tasks.evaluate(
            cfg, model, starts[m], val_inits, eval_dir, run_name, i, member=m
        )
        scores[m] = tasks.load_scores(eval_dir)
    # 4. register, the lead first (with the iteration's metrics), then the others
    ranked = ranking(state)
    lead = ranked[0]
    metrics = iteration_metrics(stats, train_stats, evals, lead)
    registered = register(cfg, parent, run_name, i, trained, metrics, evals, scores, ranked)
    return PopulationStep(Path(trained[lead]), metrics, registered[lead], scores[lead], trained)
