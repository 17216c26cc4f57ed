"""The one self-play loop: warm start, then per iteration rollout → train → evaluate → register.

    plan(cfg)                               # which iterations run, and what each waits for
    results = run_loop(cfg, "runs/r1")      # in-process: `sparring run`, the benches

`run_loop` calls the stage functions of `sparring.loop.tasks` in order, in this process; the
KFP graph (pipelines/selfplay.py) unrolls the same `plan` into one task per stage call, so the
two play the same games and reach the same evaluation seed for seed
(tests/pipeline/test_pipeline_e2e.py::test_in_process_loop_plays_the_same_games_as_the_kfp_pipeline).
Of the deployment it reads only its ports, storage and tracking: S3 or a local folder
(`storage.root`), MLflow or nothing (`tracking.enabled: false`, what the benches use). Every
stage runs on the recipe's `device`; the KFP graph alone moves GPU-less steps to the CPU.

Steps (the numbers repeat in the body):
  0. start: store the config, open the MLflow parent run (when tracking is on)
  1. game-init: seeded train/val/test states
  2. the initial model, optionally warm-started by SFT on scripted self-play
  3. optionally, evaluate it on val before any update (`evaluate_start`): the table's first row
  4. per iteration: rollout (or, with `train_backend: verl`, one verl task that plays and
     trains), GRPO update (its KL anchor the start, or with `magnet_every` the newest model
     the plan moved it to), evaluation on val states, register (champion if better); with a
     `population`, each of these for every member (sparring.loop.population)
  5. with `average`, the iterates distilled into one model (the last iterate fine-tuned on
     every iteration's rollout), evaluated on val and registered under the alias `average`:
     the run's final model from then on
  6. with `game_init.num_test` > 0, the start and the final model once on the test states
  7. finish: end the parent run, the run's summary
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from sparring.loop import tasks
from sparring.loop.config import PipelineConfig
from sparring.loop.io import log
from sparring.loop.plan import IterationPlan, plan


class Iteration(NamedTuple):
    """What one iteration produced."""

    iteration: int
    model_dir: Path  # the trained checkpoint (the next rollout's policy)
    metrics: dict[str, float]  # rollout/*, train/*, eval/*, perf/*
    registered: tasks.Registered
    val_scores: dict[str, float]  # the champion metric per val game (tasks.game_scores)


class LoopResult(NamedTuple):
    """A whole run of the loop."""

    run_name: str  # the storage key: the campaign's, else the run's unique id
    parent_run_id: str  # "" with tracking off
    start: Iteration | None  # the model before any update, with `evaluate_start`
    iterations: list[Iteration]
    average: Iteration | None  # the iterates distilled, with `average`
    test: dict[str, float]  # test/start, test/final, test/gain, test/gain_se; {} without test
    summary: str  # the run summary (Markdown) that `finish` wrote


def run_loop(
    cfg: PipelineConfig,
    work: str | Path,
    job_id: str | None = None,
    on_iteration: Callable[[Iteration], None] | None = None,
) -> LoopResult:
    """Run every iteration of `cfg` in this process, files under `work`; see the module
    docstring. `on_iteration` sees each finished iteration, and first the start's evaluation
    with `evaluate_start` (a bench's live curve)."""
    work = Path(work)
    job_id = job_id or f"{cfg.name}-{uuid.uuid4().hex}"  # the storage key, unless a campaign's
    # 0. start
    run_name, parent = tasks.start(cfg, job_id, job_id)
    try:
        start, done, average, test = _iterate(cfg, work, run_name, parent, on_iteration)
    except Exception as err:  # 7. finish, failed (a signal's Stopped is the caller's to report)
        try:
            tasks.finish(cfg, job_id, job_id, failed=True)
        except Exception as also:  # e.g. MLflow gone too: the first error is the one to see
            err.add_note(f"and ending the MLflow parent run failed: {also}")
        raise
    # 7. finish
    summary = tasks.finish(cfg, job_id, job_id)
    return LoopResult(run_name, parent, start, done, average, test, summary)


def _iterate(
    cfg: PipelineConfig,
    work: Path,
    run_name: str,
    parent: str,
    on_iteration: Callable[[Iteration], None] | None,
) -> tuple[Iteration | None, list[Iteration], Iteration | None, dict[str, float]]:
    """Steps 1-6: game-init, the initial model, its evaluation, the iterations, the average,
    the test."""
    # 1. game-init
    log("game-init")
    inits = tasks.game_init(cfg, work / "inits", run_name)
    train_inits, val_inits = str(inits["train"]), str(inits["val"])
    # 2. the initial model, warm-started
    log(f"initial-model {cfg.model}")
    model = tasks.initial_model(cfg, work / "initial")
    if cfg.warm_start:
        log("warm-start")
        tasks.warm_start(cfg, str(model), train_inits, work / "warm")
        model = work / "warm"
    start_model = magnet = model  # the KL anchor: the start, or with magnet_every the newest
    schedule = None
    # 3. the start, evaluated (and recorded: no register step follows it)
    start = None
    if cfg.evaluate_start:
        i = cfg.first_iteration - 1
        start = _evaluate(cfg, model, None, val_inits, work, run_name, i, parent or None)
        if on_iteration:
            on_iteration(start)
    # 4. the iterations
    done, members = [], None  # a population's checkpoints, member -> folder
    for step in plan(cfg):
        i, out = step.iteration, work / str(step.iteration)
        log(f"iteration {i}: rollout, train, evaluate, register")
        if cfg.population:  # K members (sparring.loop.population), the lead's as the model
            from sparring.loop import population

            if members is None:  # every member the start model, or a resumed run's members
                members = population.start_members(cfg, run_name, i, str(model), work / "resumed")
            previous = work / str(i - 1) / "rollout" / population.STATE_FILE if done else None
            ran = population.iteration(
                cfg, members, str(magnet), train_inits, val_inits, step, out, run_name,
                parent, previous,
            )  # fmt: skip
            members = ran.members
            it = Iteration(i, ran.model_dir, ran.metrics, ran.registered, ran.val_scores)
        else:
            it = _iteration(cfg, model, magnet, train_inits, val_inits, step, work, run_name,
                            parent, schedule)  # fmt: skip
            if cfg.opponents.mixed:
                schedule = out / "rollout" / "schedule.json"
        if step.moves_magnet:
            magnet = it.model_dir
        done.append(it)
        if on_iteration:
            on_iteration(it)
        model = it.model_dir
    # 5. the iterates as one model
    average = _average(cfg, model, val_inits, work, run_name, parent) if cfg.average else None
    model = average.model_dir if average else model
    # 6. the claim: start and final model on the test states, once
    test = {}
    if cfg.game_init.num_test:
        log("test: the start and the final model on the test states")
        test = tasks.evaluate_test(
            cfg, str(start_model), str(model), str(inits["test"]), work / "test", run_name,
            parent or None, done[-1].iteration,
        )  # fmt: skip
    return start, done, average, test


def _average(
    cfg: PipelineConfig, last: Path, val_inits: str, work: Path, run_name: str, parent: str
) -> Iteration:
    """5. The iterates distilled (`tasks.average`), evaluated on val against the last
    iterate, and registered as the last iteration's `average`."""
    i = plan(cfg)[-1].iteration
    out, name = work / str(i) / tasks.AVERAGE, tasks.AVERAGE
    log("average: distill the iterates into one model, evaluate and register it")
    metrics = tasks.average(cfg, str(last), run_name, out / "trained")
    evaluated, _ = tasks.evaluate(
        cfg, str(out / "trained"), str(last), val_inits, out / "eval", run_name, i, member=name
    )
    scores = tasks.load_scores(out / "eval")
    registered = tasks.register(  # in a run of its own: the iteration's run stays as it was
        cfg, parent, run_name, i, str(out / "trained"), metrics | evaluated, scores=scores,
        member=name, curve=False,
    )  # fmt: skip
    return Iteration(i, out / "trained", metrics | evaluated, registered, scores)


def _iteration(
    cfg: PipelineConfig,
    model: Path,
    reference: Path,
    train_inits: str,
    val_inits: str,
    step: IterationPlan,
    work: Path,
    run_name: str,
    parent: str,
    schedule: Path | None,
) -> Iteration:
    """4. One learner's iteration: rollout and update, evaluation, register."""
    i, out = step.iteration, work / str(step.iteration)
    metrics = _play_and_train(
        cfg, model, reference, train_inits, val_inits, step, out, run_name, parent, schedule
    )
    trained = out / "trained"
    evaluated = _evaluate(cfg, trained, model, val_inits, work, run_name, i)
    metrics |= evaluated.metrics
    registered = tasks.register(
        cfg, parent, run_name, i, str(trained), metrics, [out / "eval" / "metrics.json"],
        scores=evaluated.val_scores,
    )  # fmt: skip
    return Iteration(i, trained, metrics, registered, evaluated.val_scores)


def _play_and_train(
    cfg: PipelineConfig,
    model: Path,
    reference: Path,
    train_inits: str,
    val_inits: str,
    step: IterationPlan,
    out: Path,
    run_name: str,
    parent: str,
    schedule: Path | None,
) -> dict[str, float]:
    """4a. One iteration's rollout and GRPO update (or verl's, which does both; or the SFT
    control's round, `sparring.loop.control`); the new checkpoint goes to `out/trained`.
    Returns their metrics."""
    i, trained = step.iteration, out / "trained"
    if cfg.sft_control:
        from sparring.loop.control import sft_round

        return sft_round(cfg, str(model), train_inits, i, step.games, trained)
    if cfg.train_backend == "verl":
        from sparring.loop.verl_task import train_verl

        return train_verl(
            cfg, str(model), train_inits, val_inits, i, step.games, trained, out / "verl", run_name
        )
    rollout = tasks.rollout(
        cfg, str(model), train_inits, i, step.games, out / "rollout", run_name,
        schedule,
    )  # fmt: skip
    samples = str(out / "rollout" / "samples.parquet")
    optimizer = {}  # optimizer_state: carry: AdamW's state, from iteration to iteration
    if cfg.train.optimizer_state == "carry":
        optimizer = {"optimizer_in": out.parent / str(i - 1) / "optimizer"}
        optimizer["optimizer_out"] = out / "optimizer"
    trained_metrics = tasks.train(
        cfg, str(model), samples, trained, str(reference), parent or None, i, **optimizer
    )
    return rollout | trained_metrics


def _evaluate(
    cfg: PipelineConfig,
    model: Path,
    previous: Path | None,
    val_inits: str,
    work: Path,
    run_name: str,
    iteration: int,
    record: str | None = None,
) -> Iteration:
    """4b. Evaluate `model` on the val states (against `previous` where a mode needs it); with
    `record`, a parent run id, log it there (the start, which no register records)."""
    out = work / str(iteration) / "eval"
    previous_dir = str(previous) if previous else None
    metrics, _ = tasks.evaluate(
        cfg, str(model), previous_dir, val_inits, out, run_name, iteration, record
    )
    no_version = tasks.Registered("", "", "")
    return Iteration(iteration, model, metrics, no_version, tasks.load_scores(out))
