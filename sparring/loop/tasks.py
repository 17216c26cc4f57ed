"""The pipeline's tasks as plain functions over a `PipelineConfig`.

Each KFP component in components/ parses its typed inputs, calls ONE of these, and writes its
outputs; tests call them directly, without KFP. The spine, per iteration i:

    start          check S3 and MLflow answer, store config.yaml, open the MLflow parent run
    game_init      train/val initial states                 -> <root>/<run>/inits
    initial_model  the tiny model or the configured ref (hub name, path, s3://, models:/)
    warm_start     SFT on scripted self-play (optional, sparring.loop.steps.warm_start)
    rollout        self-play games + samples                -> <root>/<run>/<i>/rollout
    train          GRPO on the samples                      -> a HF checkpoint
    evaluate       val games: selfplay / vs previous / vs scripted -> <root>/<run>/<i>/eval
                   (the start's, before any update, is recorded here: no register follows it)
    register       verify the checkpoint train stored       -> <root>/<run>/<i>/checkpoint
                   (or copy it, in S3, into its logged model's folder), log the iteration to
                   MLflow, register a model version (`champion` if better)
    evaluate_test  once, after the last iteration: the start and the final model on the
                   test states, their paired gain   -> <root>/<run>/test
    finish         exit handler: end the parent run (FAILED if a task failed); summary

With `train_backend: verl`, rollout + train are one task, `sparring.loop.verl_task`.
Every task reports the seconds of its own compute (`perf/*_seconds`) so that the pipeline
benchmark can tell compute from overhead.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import yaml

from sparring import heap
from sparring.loop import league, recent, reports, steps
from sparring.loop.config import PipelineConfig
from sparring.loop.io import log, run_uri, upload
from sparring.metrics import (
    ALL_ROLES,
    BASELINE,
    EVAL,
    GAIN_OVER_BEST_TRIVIAL,
    PERF,
    TEST,
    VS_PREVIOUS,
    metric_name,
    split_eval,
)
from sparring.rollout import RolloutConfig, build_policies, learner_plays, load_inits
from sparring.stats import paired_gain

if TYPE_CHECKING:
    from sparring.evaluate import EvalConfig

# Compute-time metrics the tasks report; the rest of the wall time is pipeline overhead.
PERF_EVAL = metric_name(PERF, "eval_seconds")
COMPUTE_METRICS = ("perf/rollout_seconds", "perf/train_seconds", PERF_EVAL)
# Each task's peak resident memory (`sparring.heap.PeakRSS`): warm_start, rollout, train, eval.
PEAK_RSS = "perf/{}_peak_rss_gib"
PEAK_EVAL = PEAK_RSS.format("eval")
PEAK_METRICS = tuple(
    PEAK_RSS.format(t) for t in ("warm_start", "rollout", "train", "eval", "average")
)
SCORES_FILE = "scores.json"  # an evaluation's champion metric per game (`game_scores`)
# Final states of a successful pipeline: the KFP backend says COMPLETE (or CACHED); kfp.local
# and Vertex say SUCCEEDED.
SUCCESS_STATES = ("COMPLETE", "CACHED", "SUCCEEDED")


def perf_totals(reports: list[dict[str, Any]]) -> dict[str, float]:
    """The tasks' `COMPUTE_METRICS` summed and their `PEAK_METRICS` maxed over `reports` (each
    task's metrics; 0 where a report lacks one): what a whole run spent and peaked at."""
    return {k: sum(float(m.get(k, 0.0)) for m in reports) for k in COMPUTE_METRICS} | {
        k: max((float(m.get(k, 0.0)) for m in reports), default=0.0) for k in PEAK_METRICS
    }


def start(cfg: PipelineConfig, job_id: str, job_name: str = "") -> tuple[str, str]:
    """Store the config under `<root>/<run>/config` (which checks S3), close stale parent runs
    of this pipeline and open the MLflow parent run (which checks MLflow), once per KFP run: a
    retried `start` finds the parent its first try opened. Returns (run, parent run id).

    The run (the storage key) is the campaign id `cfg.campaign`, else the KFP run's unique id
    `job_id`, never a display name; the MLflow run is named `cfg.run_name` or `job_name` and
    tagged with both ids."""
    from sparring.loop import runs

    run_name = cfg.campaign or job_id
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "config.yaml").write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
        upload(cfg, tmp, run_uri(cfg, run_name, "config"))
    if not cfg.tracking.enabled:
        return run_name, ""
    parent = runs.open_parent(cfg, run_name, job_id, job_name)
    log(f"MLflow parent run {parent} in experiment {cfg.tracking.experiment!r}")
    return run_name, parent


def game_init(cfg: PipelineConfig, out_dir: str | Path, run_name: str) -> dict[str, Path]:
    """Write train.parquet, val.parquet and test.parquet into `out_dir` and upload them."""
    from sparring.game_init import write_inits

    paths = write_inits(cfg.game_init, out_dir, progress=False)
    upload(cfg, out_dir, run_uri(cfg, run_name, "inits"))
    return paths


def initial_model(cfg: PipelineConfig, out_dir: str | Path) -> Path:
    """Materialize `cfg.model` as a HF checkpoint folder at `out_dir`."""
    out = Path(out_dir)
    from sparring.models import resolve_model
    from sparring.registry import resolve_model_uri
    from sparring.tracking import connect

    ref = cfg.model
    if ref.startswith("models:/") and not cfg.tracking.enabled:
        raise ValueError(f"model {ref!r} needs the registry, but tracking.enabled is false")
    if ref.startswith("models:/"):  # look it up in this pipeline's registry
        ref = resolve_model_uri(ref, connect(cfg.tracking))
    local = resolve_model(ref, storage_config=cfg.storage.client_config())
    if Path(local).is_dir():
        shutil.copytree(local, out, dirs_exist_ok=True, ignore=shutil.ignore_patterns(".complete"))
    else:  # a hub name: fetch the snapshot once, so every task loads the same files
        from huggingface_hub import snapshot_download

        snapshot_download(local, local_dir=out)
    return out


@heap.releases_memory
def warm_start(
    cfg: PipelineConfig, model_dir: str, train_inits: str, out_dir: str | Path
) -> dict[str, float]:
    """SFT `model_dir` on scripted self-play of `warm_start.num_states` train states; its
    metrics, also in the checkpoint's metrics.json."""
    ws = cfg.warm_start
    assert ws is not None and ws.agent is not None, "warm_start is off in this config"
    states = load_inits(train_inits, ws.num_states)
    with heap.PeakRSS() as peak:
        played = steps.warm_start(
            model_dir, cfg.rollout, ws.agent, states, out_dir, ws.train, cfg.device
        )
    metrics = played.metrics | {PEAK_RSS.format("warm_start"): peak.gib}
    (Path(out_dir) / "metrics.json").write_text(json.dumps(metrics, indent=2, sort_keys=True))
    return metrics


def iteration_plan(
    cfg: PipelineConfig, train_inits: str, iteration: int, games: int
) -> tuple[list[tuple[str, dict]], RolloutConfig]:
    """The train states of `iteration` (`games / rollout.games_per_init`, rotating through the
    list) and its rollout config (sampling seed = `rollout.sampling.seed + iteration`)."""
    states = steps.rotate(load_inits(train_inits), iteration, games // cfg.rollout.games_per_init)
    sampling = cfg.rollout.sampling
    seed = None if sampling.seed is None else sampling.seed + iteration
    rcfg = cfg.rollout.model_copy(update={"sampling": sampling.model_copy(update={"seed": seed})})
    return states, rcfg


def topup_states(
    cfg: PipelineConfig, train_inits: str, iteration: int, games: int
) -> list[tuple[str, dict]]:
    """The train states dynamic sampling's top-up may play in `iteration` (`train.min_groups`):
    `train.max_topup_rounds` rounds of as many states as the iteration plays, those that follow
    its own in the rotation (the next iterations play them again, afresh), without repeats."""
    every = load_inits(train_inits)
    n = games // cfg.rollout.games_per_init
    start = iteration * n
    seen = {init_id for init_id, _ in steps.rotate(every, iteration, n)}
    spare = []
    for j in range(n, n * (1 + cfg.train.max_topup_rounds)):
        init_id, state = every[(start + j) % len(every)]
        if init_id not in seen:
            seen.add(init_id)
            spare.append((init_id, state))
    return spare


@heap.releases_memory
def rollout(
    cfg: PipelineConfig,
    model_dir: str,
    train_inits: str,
    iteration: int,
    games: int,
    out_dir: str | Path,
    run_name: str,
    schedule: str | Path | None = None,
) -> dict[str, float]:
    """Play `games` games (train states, rotating per iteration) and upload them, with the
    learner's rolling window of recent plays per role for a game with a `role_breakdown`
    (`sparring.loop.recent`); with
    `train.min_groups`, more games until that many groups carry signal (`steps.TopUp`).

    Pure self-play, or with `opponents.selfplay_fraction` < 1 the opponent mix of
    `sparring.loop.league`: the difficulty schedule continues from the previous rollout's
    (`schedule`, else the stored one), seats the games, moves with the learner's rewards and
    is saved in `out_dir`; seated `past-<k>` opponents are loaded from storage."""
    n = games // cfg.rollout.games_per_init
    states, rcfg = iteration_plan(cfg, train_inits, iteration, games)
    mix = (
        league.opponent_mix(cfg, n, iteration, run_name, schedule) if cfg.opponents.mixed else None
    )
    seats = sorted({name for row in mix.plan for name in row}) if mix else rcfg.seats
    with heap.PeakRSS() as peak, tempfile.TemporaryDirectory(prefix="sparring-past-") as tmp:
        past = league.past_models(cfg, run_name, iteration, model_dir, seats, tmp) if mix else {}
        policies = build_policies(
            cfg.game,
            model_dir,
            seats,
            cfg.device,
            rcfg.max_batch_size,
            extra_models={name: local for name, (_, local) in past.items()},
            backend=rcfg.backend,
            temperature=rcfg.sampling.temperature,
        )
        top_up = None
        if cfg.train.min_groups:  # dynamic sampling (the recipe allows it without a mix)
            top_up = steps.TopUp(cfg.train, topup_states(cfg, train_inits, iteration, games))
        played = steps.self_play(
            states, policies, rcfg, out_dir, mix.plan if mix else None, top_up=top_up
        )
    stats = played.metrics | {PEAK_RSS.format("rollout"): peak.gib}
    if mix:
        models = {name: uri for name, (uri, _) in past.items()}
        stats |= league.save_schedule(
            mix, states, iteration, played.result.episodes, out_dir, models
        )
    if cfg.game.cls.role_breakdown:  # per-role windows only where roles are reported
        window = recent.recent_state(cfg, run_name, iteration)  # rollout i-1's, from storage
        stats |= recent.save_recent(window, played.result.episodes, iteration, out_dir)
    (Path(out_dir) / "stats.json").write_text(json.dumps(stats, indent=2))
    upload(cfg, out_dir, run_uri(cfg, run_name, iteration, "rollout"))
    log(f"iteration {iteration}: rollout reward {stats['rollout/normalized_reward']:.3f}")
    return stats


@heap.releases_memory
def train(
    cfg: PipelineConfig,
    model_dir: str,
    samples: str,
    out_dir: str | Path,
    ref_model_dir: str | None = None,
    parent_run_id: str | None = None,
    iteration: int = 0,
    optimizer_in: str | Path | None = None,
    optimizer_out: str | Path | None = None,
) -> dict[str, float]:
    """GRPO on one rollout's samples (`sparring.loop.steps.grpo_step`); a HF checkpoint in
    `out_dir`, unchanged when there is no learning signal (`train/no_signal` = 1). With
    `parent_run_id`, every optimizer step's `train_step/*` metrics go to the iteration's MLflow
    run while it trains. With `train.optimizer_state: carry`, AdamW continues from the previous
    update's `optimizer_in` folder and leaves its state in `optimizer_out`."""
    on_step = None
    if parent_run_id:
        from sparring.tracking import PipelineRun

        on_step = PipelineRun.attach(parent_run_id, cfg.tracking).step_logger(iteration)
    with heap.PeakRSS() as peak:
        trained = steps.grpo_step(
            model_dir, samples, out_dir, cfg.train, ref_model_dir, on_step, cfg.device,
            optimizer_in, optimizer_out, iteration - cfg.first_iteration,
        )  # fmt: skip
    return trained.metrics | {PEAK_RSS.format("train"): peak.gib}


AVERAGE = "average"
"""The distilled iterates' name: their registry alias, and their folder in the last iteration's
storage (`<run>/<i>/eval/average`, `<run>/<i>/members/average/checkpoint`)."""


@heap.releases_memory
def average(
    cfg: PipelineConfig, model_dir: str, run_name: str, out_dir: str | Path
) -> dict[str, float]:
    """The iterates distilled into one model (`cfg.average`): `model_dir`, the last iterate,
    fine-tuned (`sparring.sft`, `average.train`) on the stored rollout samples of every
    planned iteration, each played by that iteration's model (`source: rollouts`), or on rows
    that weigh every decision's replies by the mixture of the tables their evaluations read
    out (`source: tables`). A HF checkpoint in `out_dir`; returns the SFT's metrics."""
    from sparring.loop.plan import plan
    from sparring.sft import sft

    assert cfg.average is not None, "average is off in this config"
    iterations = [step.iteration for step in plan(cfg)]
    data = _mixture_rows if cfg.average.source == "tables" else _rollout_samples
    with tempfile.TemporaryDirectory() as tmp, heap.PeakRSS() as peak:
        samples = data(cfg, run_name, iterations, model_dir, Path(tmp))
        stats = sft(model_dir, samples, out_dir, cfg.average.train, cfg.device)
    log(f"average: iterations {iterations[0]}-{iterations[-1]}' {cfg.average.source} "
        f"distilled into {out_dir}")  # fmt: skip
    return stats.metrics | {PEAK_RSS.format("average"): peak.gib}


def _rollout_samples(
    cfg: PipelineConfig, run_name: str, iterations: list[int], model_dir: str, tmp: Path
) -> list[Path]:
    """Each iteration's stored `samples.parquet`, downloaded into `tmp` (games and stats stay
    in storage), its rows' `weight` scaled by the iteration's mixture weight (over their mean,
    so the rows weigh as much in all) unless the weights are uniform."""
    import pandas as pd

    from sparring import storage
    from sparring.sft import row_weights

    weights = cfg.average.mixture_weights(len(iterations))
    samples = []
    for i, w in zip(iterations, weights, strict=True):
        uri = run_uri(cfg, run_name, i, "rollout")
        wanted = [e for e in storage.verify(uri, cfg.storage.client_config())
                  if e.path == "samples.parquet"]  # fmt: skip
        storage.download_dir(uri, tmp / str(i), cfg.storage.client_config(), wanted)
        path = tmp / str(i) / "samples.parquet"
        if len(set(weights)) > 1:
            df = pd.read_parquet(path)
            df["weight"] = row_weights(df) * (w / (sum(weights) / len(weights)))
            df.to_parquet(path)
        samples.append(path)
    return samples


def _mixture_rows(
    cfg: PipelineConfig, run_name: str, iterations: list[int], model_dir: str, tmp: Path
) -> list[Path]:
    """The game's `average_rows` of each iteration's stored evaluation (its
    `policy_metrics`, the updated model's table), as one samples parquet in `tmp`."""
    import pandas as pd
    from transformers import AutoTokenizer

    from sparring import storage

    iterates = []
    for i in iterations:
        uri = run_uri(cfg, run_name, i, "eval")
        text = storage.read_text(uri, "metrics.json", cfg.storage.client_config())
        if text is None:
            raise FileNotFoundError(f"{uri}/metrics.json is missing: iteration {i} has no "
                                    "stored evaluation to read its table from")  # fmt: skip
        iterates.append({k.removeprefix("eval/"): v for k, v in json.loads(text).items()})
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    temperature = cfg.eval.rollout.sampling.temperature
    weights = cfg.average.mixture_weights(len(iterates))
    rows = cfg.game.make().average_rows(tokenizer, iterates, temperature, weights)
    path = tmp / "mixture.parquet"
    pd.DataFrame(rows).to_parquet(path)
    return [path]


def evaluate(
    cfg: PipelineConfig,
    model_dir: str,
    previous_dir: str | None,
    val_inits: str,
    out_dir: str | Path,
    run_name: str,
    iteration: int,
    parent_run_id: str | None = None,
    member: str | None = None,
) -> tuple[dict[str, float], str]:
    """Evaluate on val states; write metrics.json, rewards.png, transcripts.json, the game's
    report files and scores.json (the champion metric per game), upload them (a population
    `member`'s into `<i>/eval/<member>`). With `parent_run_id` (the start's evaluation, which
    no register step records) the metrics go to the iteration's MLflow child run and the
    parent's curve. Returns (metrics, an HTML report for the KFP UI)."""
    from sparring.evaluate import write_eval

    metrics, episodes = _play_eval(cfg, cfg.eval, model_dir, previous_dir, val_inits)
    paths = write_eval(metrics, episodes, out_dir, cfg.game)
    scores = game_scores(episodes, cfg.champion_metric)
    (Path(out_dir) / SCORES_FILE).write_text(json.dumps(scores))
    upload(cfg, out_dir, run_uri(cfg, run_name, iteration, "eval", *([member] if member else [])))
    whose = f" ({member})" if member else ""
    log(f"iteration {iteration}: {cfg.champion_metric}{whose} = "
        f"{metrics.get(cfg.champion_metric, 0):.3f}")  # fmt: skip
    if parent_run_id:
        from sparring.tracking import PipelineRun

        run = PipelineRun.attach(parent_run_id, cfg.tracking)
        run.log_metrics(iteration, metrics)
        run.finish()
    return metrics, reports.eval_report(metrics, paths["plot"], paths["transcripts"], iteration)


@heap.releases_memory
def _play_eval(
    cfg: PipelineConfig, ecfg: Any, model_dir: str, previous_dir: str | None, inits: str
) -> tuple[dict[str, float], dict[str, list]]:
    """`sparring.evaluate.evaluate` of `model_dir` with `ecfg` (an EvalConfig) on `inits`;
    `previous_dir` is loaded only where a mode plays it (`vs_previous`). Both play on
    `ecfg.rollout.backend`."""
    from sparring.evaluate import evaluate as run_eval
    from sparring.generation.factory import make_backend

    batch, backend = ecfg.rollout.max_batch_size, ecfg.rollout.backend
    with heap.PeakRSS() as peak:
        policy = make_backend(model_dir, backend, cfg.device, batch)
        previous = (
            make_backend(previous_dir, backend, cfg.device, batch)
            if previous_dir and VS_PREVIOUS in ecfg.modes
            else None
        )
        t0 = time.perf_counter()
        metrics, episodes = run_eval(policy, inits, ecfg, previous, progress=False)
        metrics[PERF_EVAL] = time.perf_counter() - t0
    metrics[PEAK_RSS.format("eval")] = peak.gib
    return metrics, episodes


def game_scores(episodes: dict[str, list], metric: str) -> dict[str, float]:
    """`metric` (an eval/<mode>/<role>/normalized_reward) per game of its mode: the learner's
    mean reward over its seats of that role (every seat for `all`); their mean is `metric`
    when every game seats the learner alike. {} for other metrics (no per-game value)."""
    mode, role, name = split_eval(metric) or ("", "", "")
    per_game: dict[str, list[float]] = {}
    for e, seat in learner_plays(episodes.get(mode, [])) if name == "normalized_reward" else []:
        if role in (ALL_ROLES, e.roles[seat]):
            per_game.setdefault(e.game_id, []).append(e.rewards[seat])
    return {game: float(np.mean(rewards)) for game, rewards in per_game.items()}


def load_scores(eval_dir: str | Path) -> dict[str, float]:
    """The per-game champion metric an evaluation wrote (`game_scores`), in play order."""
    return json.loads((Path(eval_dir) / SCORES_FILE).read_text())


def test_eval(cfg: PipelineConfig, baselines: bool) -> EvalConfig:
    """The test step's EvalConfig: every test state, only the champion metric's mode (no
    game-added lineups), the game's baselines if asked (the final model's evaluation)."""
    mode = (split_eval(cfg.champion_metric) or ("",))[0]
    update = {"modes": [mode], "num_games": None, "breakdown": False, "baselines": baselines}
    return cfg.eval.model_copy(update=update)


def evaluate_test(
    cfg: PipelineConfig,
    start_dir: str,
    final_dir: str,
    test_inits: str,
    out_dir: str | Path,
    run_name: str,
    parent_run_id: str | None = None,
    iteration: int = 0,
) -> dict[str, float]:
    """Score the start and the final model once on every test state, in the champion metric's
    mode alone (`test_eval`; `vs_previous` plays the start): `test/start`, `test/final`, and
    the paired `test/gain` with its standard error `test/gain_se`; beside them the game's baselines on
    the same states, `test/baseline/<name>` (with `_se`), and the final model's
    `test/gain_over_best_trivial` (paired over the states), and both evaluations' seconds
    `perf/eval_seconds` (and their peak memory). Written to test.json beside both models' scores, uploaded, and logged
    to the parent run at step `iteration` (the last)."""
    out, figures, scores, metrics = Path(out_dir), {PERF_EVAL: 0.0}, {}, {}
    for name, model in (("start", start_dir), ("final", final_dir)):
        ecfg = test_eval(cfg, baselines=name == "final")
        metrics, episodes = _play_eval(cfg, ecfg, model, start_dir, test_inits)
        figures[metric_name(TEST, name)] = metrics[cfg.champion_metric]
        figures[PERF_EVAL] += metrics[PERF_EVAL]
        figures[PEAK_EVAL] = max(figures.get(PEAK_EVAL, 0.0), metrics[PEAK_EVAL])
        scores[name] = game_scores(episodes, cfg.champion_metric)
    gain, se = paired_gain(scores["start"], scores["final"])
    figures |= {metric_name(TEST, "gain"): gain, metric_name(TEST, "gain_se"): se}
    beside = (metric_name(EVAL, BASELINE, ""), metric_name(EVAL, GAIN_OVER_BEST_TRIVIAL))
    figures |= {  # the final model's evaluation's, renamed eval/ -> test/
        metric_name(TEST, k.removeprefix(metric_name(EVAL, ""))): v
        for k, v in metrics.items()
        if k.startswith(beside)
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "test.json").write_text(json.dumps({"figures": figures, "scores": scores}, indent=1))
    upload(cfg, out, run_uri(cfg, run_name, "test"))
    log(f"test: {cfg.champion_metric} {figures['test/start']:.3f} at the start, "
        f"{figures['test/final']:.3f} at the end: gain {gain:+.3f} ± {se:.3f} (paired s.e.)")  # fmt: skip
    trivial = metric_name(TEST, GAIN_OVER_BEST_TRIVIAL)
    if trivial in figures:
        log(f"test: the final model minus the best trivial baseline {figures[trivial]:+.3f} ± "
            f"{figures[trivial + '_se']:.3f} (paired s.e.)")  # fmt: skip
    if parent_run_id:
        from mlflow.entities import Metric

        from sparring.tracking import connect

        now = int(time.time() * 1000)
        batch = [Metric(k, v, now, iteration) for k, v in figures.items()]
        connect(cfg.tracking).log_batch(parent_run_id, metrics=batch)
    return figures


class Registered(NamedTuple):
    """What `register` did."""

    checkpoint_uri: str  # the verified checkpoint
    version: str  # its model version
    champion_version: str  # where `champion` points afterwards


def register(
    cfg: PipelineConfig,
    parent_run_id: str,
    run_name: str,
    iteration: int,
    model_dir: str,
    metrics: dict[str, float],
    artifacts: list[str | Path] = (),  # type: ignore[assignment]
    kfp_run_id: str | None = None,
    scores: dict[str, float] | None = None,
    member: str | None = None,
    curve: bool = True,
) -> Registered:
    """Log the iteration's metrics, artifacts and input datasets to its MLflow child run, then
    store the checkpoint once, as an MLflow model, and register it (`sparring.registry.publish`,
    scored by `cfg.champion_metric`, per val game `scores`, `load_scores` of its evaluation).
    `model_dir` is a HF folder, or a checkpoint artifact whose reference
    (sparring.loop.checkpoints) names the stored checkpoint: then no weight is uploaded, and
    once the registry holds its own copy, the previous iteration's `<run>/<i-1>/checkpoint`
    (every consumer of it has finished) is deleted (`drop_pipeline_copies`).
    Safe to retry: a rerun finds the version it registered. If storage fails, nothing is
    registered. A population `member` is stored at `<run>/<i>/members/<member>/checkpoint`
    and registered as its own version under its own alias (the member's name); its copies are
    kept. `curve`: the eval metrics also go to the parent run's curve (a population logs
    only its lead member's), and the version is the iteration's child run's; any other
    member's (the average's) is logged to a child run of its own (`PipelineRun`), so that its
    metrics never overwrite the iteration's.
    """
    from sparring import registry, storage
    from sparring.loop.checkpoints import stored_uri
    from sparring.tracking import RUN_TAG, PipelineRun

    evals = {k: v for k, v in metrics.items() if split_eval(k)}
    if cfg.champion_metric not in evals:
        raise KeyError(
            f"champion_metric {cfg.champion_metric!r} not in eval metrics {sorted(evals)}"
        )
    whose = ("members", member) if member else ()
    stored, own = stored_uri(model_dir), run_uri(cfg, run_name, iteration, *whose, "checkpoint")
    if not cfg.tracking.enabled:  # store the checkpoint; there is no registry to tell
        if stored is None:
            return Registered(upload(cfg, model_dir, own), "", "")
        if stored != own:
            storage.copy_dir(stored, own, cfg.storage.client_config())
        storage.verify(own, cfg.storage.client_config())
        return Registered(own, "", "")
    run = PipelineRun.attach(parent_run_id, cfg.tracking, None if curve else member)
    game, group_key = cfg.game.name, cfg.train.group_key
    tags = {"parent_run_id": parent_run_id, "game": game, "group_key": group_key}
    tags[RUN_TAG] = run_name  # league.past_models finds an iteration's checkpoint by it
    if kfp_run_id:
        tags["kfp_run_id"] = kfp_run_id
    reg = registry.publish(
        run.client,
        cfg.registered_model,
        None if stored else model_dir,
        run_id=run.iteration_run(iteration),
        iteration=iteration,
        metrics=evals,
        score=evals[cfg.champion_metric],
        fallback_uri=own,
        scores=scores,
        eval_key=cfg.eval_key,
        artifacts_destination=cfg.tracking.artifacts_destination,
        tags=tags,
        facts={"base model": cfg.model, "game": game, "group key": group_key, "run": run_name}
        | ({"member": member} if member else {}),
        parent_run_id=parent_run_id if curve else None,
        storage_config=cfg.storage.client_config(),
        stored=stored,
        member=member,
    )
    if member is None:
        drop_pipeline_copies(cfg, run.client, run_name, [iteration - 1])
    run.log_metrics(iteration, {k: v for k, v in metrics.items() if k not in evals})
    for path in artifacts:
        run.log_artifact(path, iteration)
    for folder, file, name in [
        ("inits", "train.parquet", "game-init-train"),
        (f"{iteration}/rollout", "samples.parquet", f"samples-{iteration}"),
    ]:
        try:  # the manifest's sha256 is the digest; verl-backend runs have no rollout folder
            entries = storage.verify(run_uri(cfg, run_name, folder), cfg.storage.client_config())
        except storage.VerifyError:
            continue
        digest = next((e.sha256 for e in entries if e.path == file), None)
        if digest:
            run.log_dataset(iteration, f"{run_uri(cfg, run_name, folder)}/{file}", name, digest)
    run.finish()  # ends the child run; the parent stays open until `finish`
    log(
        f"iteration {iteration}: stored {reg.checkpoint_uri}, registered {cfg.registered_model} "
        f"v{reg.version}{f' as {member}' if member else ''} (champion: v{reg.champion_version})"
    )
    return Registered(reg.checkpoint_uri, reg.version, reg.champion_version)


def drop_pipeline_copies(cfg: PipelineConfig, client, run_name: str, iterations) -> list[str]:
    """Delete `<root>/<run>/<i>/checkpoint` of every iteration i whose registered version is
    stored elsewhere (in its logged model's folder): the copy a producer stored for the steps
    after it, once they have run. Returns what was deleted."""
    from sparring import storage
    from sparring.registry import stored_checkpoint

    dropped = []
    for i in iterations:
        own = run_uri(cfg, run_name, i, "checkpoint")
        try:
            registered = stored_checkpoint(cfg.registered_model, run_name, i, client)
        except LookupError:  # not registered (yet): keep it
            continue
        if registered.rstrip("/") != own and storage.delete_dir(own, cfg.storage.client_config()):
            log(f"iteration {i}: deleted {own}, registered as {registered}")
            dropped.append(own)
    return dropped


def finish(cfg: PipelineConfig, job_id: str, job_name: str = "", failed: bool = False) -> str:
    """End the parent run of KFP run `job_id`, FINISHED or (when a task failed) FAILED together
    with any child run still open; return a Markdown summary of the run that links to it.
    Runs as the pipeline's exit handler, so a failed task never leaves the parent RUNNING."""
    from sparring.loop import runs
    from sparring.registry import champion
    from sparring.tracking import connect

    title = cfg.run_name or job_name or job_id
    if not cfg.tracking.enabled:
        return f"## {title}: {'FAILED' if failed else 'FINISHED'} (tracking off)\n"
    client = connect(cfg.tracking)
    parent = runs.find_parent(cfg, client, job_id)
    if parent is None:  # `start` failed before it opened the parent run
        return f"## {title}\n\nfailed before the MLflow parent run was opened\n"
    status = "FAILED" if failed else "FINISHED"
    runs.end(client, parent, status)
    if not failed:  # a failed run keeps every checkpoint its retry may read
        from sparring.loop.plan import plan

        iterations = [step.iteration for step in plan(cfg)]
        drop_pipeline_copies(cfg, client, cfg.campaign or job_id, iterations)
    rows = reports.summary_rows(cfg, parent.info.run_id, client)
    best, test = (
        champion(cfg.registered_model, client),
        reports.test_figures(parent.info.run_id, client),
    )
    text = reports.run_summary(cfg, title, status, rows, best, test)
    return text + f"\nMLflow parent run: {runs.link(cfg, parent)}\n"


def champion_of(cfg: PipelineConfig) -> tuple[str, float]:
    """The registered model's champion version and its score (`""`, nan without one)."""
    from sparring.registry import champion
    from sparring.tracking import connect

    found = champion(cfg.registered_model, connect(cfg.tracking))
    return (str(found.version), float(found.tags["score"])) if found else ("", float("nan"))
