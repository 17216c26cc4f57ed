"""The pipeline's steps as plain functions over a `PipelineConfig`.

Each KFP component in components/ parses its typed inputs, calls ONE of these, and writes its
outputs; tests call them directly, without KFP. The spine, per iteration i:

    start         check S3 and MLflow answer, store config.yaml, open the MLflow parent run
    game_init     train/val initial states                 -> <root>/<run>/inits
    initial_model the tiny model or the configured ref (hub name, path, s3://, models:/)
    warm_start    SFT on scripted self-play (optional)
    rollout       self-play games + samples                -> <root>/<run>/<i>/rollout
    train         GRPO on the samples                      -> a HF checkpoint
    train_verl    (train_backend: verl, replaces rollout + train) verl's main_ppo with online
                  self-play inside verl, FSDP checkpoint merged -> a HF checkpoint
    evaluate      val games: selfplay / vs previous / vs scripted -> <root>/<run>/<i>/eval
    register      upload + verify the checkpoint           -> <root>/<run>/<i>/checkpoint,
                  log the iteration to MLflow, register a model version (`champion` if better)
    finish        exit handler: end the parent run (FAILED if a task failed); summary

Every step reports the seconds of its own compute (`perf/*_seconds`) so that the pipeline
benchmark can tell compute from overhead.
"""

from __future__ import annotations

import base64
import html
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import deque
from pathlib import Path
from typing import Any, NamedTuple

import yaml

from sparring import storage
from sparring.pipeline_config import PipelineConfig

# Compute-time metrics the steps report; the rest of the wall time is pipeline overhead.
COMPUTE_METRICS = ("perf/rollout_seconds", "perf/train_seconds", "perf/eval_seconds")


def log(message: str) -> None:
    """A progress line (`sparring run` shows lines with this prefix)."""
    print(f"[sparring] {message}", flush=True)


def _upload(cfg: PipelineConfig, local_dir: str | Path, uri: str) -> str:
    storage.upload_dir(local_dir, uri, cfg.storage.client_config())
    log(f"uploaded {uri}")
    return uri


def _uri(cfg: PipelineConfig, run_name: str, *parts: int | str) -> str:
    """`<storage.root>/<run>/<parts…>`, e.g. `s3://sparring/runs/r1/0/checkpoint`."""
    return "/".join([cfg.storage.root.rstrip("/"), run_name, *map(str, parts)])


# -- start / game-init / initial model ---------------------------------------------------------


def start(cfg: PipelineConfig, job_name: str) -> tuple[str, str]:
    """Store the config under `<root>/<run>/config` (which checks S3) and open the MLflow
    parent run (which checks MLflow). Returns (run name, parent run id)."""
    from sparring.tracking import PipelineRun

    run_name = cfg.run_name or job_name
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "config.yaml").write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
        _upload(cfg, tmp, _uri(cfg, run_name, "config"))
    run = PipelineRun.start(cfg.tracking, run_name, params=cfg.model_dump(mode="json"))
    log(f"MLflow parent run {run.run_id} in experiment {cfg.tracking.experiment!r}")
    return run_name, run.run_id


def game_init(cfg: PipelineConfig, out_dir: str | Path, run_name: str) -> dict[str, Path]:
    """Write train.parquet and val.parquet into `out_dir` and upload them."""
    from sparring.game_init import write_inits

    paths = write_inits(cfg.game_init, out_dir, progress=False)
    _upload(cfg, out_dir, _uri(cfg, run_name, "inits"))
    return paths


def initial_model(cfg: PipelineConfig, out_dir: str | Path) -> Path:
    """Materialize `cfg.model` as a HF checkpoint folder at `out_dir`."""
    out = Path(out_dir)
    if cfg.model == "tiny":
        from sparring.tiny_model import init_tiny

        return init_tiny(out)
    from sparring.models import resolve_model
    from sparring.tracking import connect, resolve_model_uri

    ref = cfg.model
    if ref.startswith("models:/"):  # look it up in this pipeline's registry
        ref = resolve_model_uri(ref, connect(cfg.tracking))
    local = resolve_model(ref)
    if Path(local).is_dir():
        shutil.copytree(local, out, dirs_exist_ok=True, ignore=shutil.ignore_patterns(".complete"))
    else:  # a hub name: fetch the snapshot once, so every task loads the same files
        from huggingface_hub import snapshot_download

        snapshot_download(local, local_dir=out)
    return out


def warm_start(
    cfg: PipelineConfig, model_dir: str, train_inits: str, out_dir: str | Path
) -> dict[str, float]:
    """SFT `model_dir` on scripted self-play of `warm_start.num_states` train states."""
    from transformers import AutoTokenizer

    from sparring.games import make_game
    from sparring.rollout import build_policies, load_inits, play, write_outputs
    from sparring.sft import sft

    ws = cfg.warm_start
    assert ws is not None, "warm_start is off in this config"
    seats = [ws.agent] * make_game(cfg.game, **cfg.game_params).num_seats
    rcfg = cfg.rollout.model_copy(update={"seats": seats, "games_per_init": 1})
    result = play(
        load_inits(train_inits, ws.num_states),
        build_policies(None, seats),
        rcfg,
        progress=False,
        scripted_tokenizer=AutoTokenizer.from_pretrained(model_dir),
    )
    with tempfile.TemporaryDirectory() as tmp:
        samples = write_outputs(result, tmp)["samples"]
        tcfg = cfg.train_config(warm_start=True, device=cfg.device)
        return sft(model_dir, [samples], out_dir, tcfg).metrics


# -- one iteration -----------------------------------------------------------------------------


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
    """Play `games` games (train states, rotating per iteration) and upload them.

    Pure self-play, or with `opponents.selfplay_fraction` < 1 the opponent mix: the
    difficulty schedule continues from the previous rollout's (`_schedule_state`), seats the
    games (`sparring.opponents.plan_seats`), moves with the learner's rewards and is saved in
    `out_dir` (`_save_schedule`). Seated `past-<k>` opponents are loaded from storage
    (`_past_models`)."""
    from sparring.rollout import build_policies, load_inits, play, write_outputs

    inits = load_inits(train_inits)
    n = games // cfg.rollout.games_per_init
    chosen = [inits[(iteration * n + j) % len(inits)] for j in range(n)]
    sampling = cfg.rollout.sampling
    seed = None if sampling.seed is None else sampling.seed + iteration
    rcfg = cfg.rollout.model_copy(update={"sampling": sampling.model_copy(update={"seed": seed})})
    mix = _opponent_mix(cfg, n, iteration, run_name, schedule) if cfg.opponents.mixed else None
    seats = sorted({name for row in mix.plan for name in row}) if mix else rcfg.seats
    with tempfile.TemporaryDirectory(prefix="sparring-past-") as tmp:
        past = _past_models(cfg, run_name, iteration, model_dir, seats, tmp) if mix else {}
        policies = build_policies(
            model_dir,
            seats,
            cfg.device,
            rcfg.max_batch_size,
            extra_models={name: local for name, (_, local) in past.items()},
            backend=rcfg.backend,
        )
        result = play(chosen, policies, rcfg, progress=False, seat_plan=mix.plan if mix else None)
    paths = write_outputs(result, out_dir)
    stats = json.loads(paths["stats"].read_text())
    if mix:
        models = {name: uri for name, (uri, _) in past.items()}
        stats |= _save_schedule(mix, chosen, iteration, result.episodes, out_dir, models)
    _upload(cfg, out_dir, _uri(cfg, run_name, iteration, "rollout"))
    log(f"iteration {iteration}: rollout reward {stats['rollout/normalized_reward']:.3f}")
    return stats


class OpponentMix(NamedTuple):
    """One rollout's opponent mix (see sparring.opponents)."""

    schedule: Any  # the DifficultySchedule it follows
    plan: list[list[str]]  # policy name per seat, per initial state
    rows: list[dict[str, Any]]  # one log row per initial state


def _schedule_state(
    cfg: PipelineConfig, run_name: str, iteration: int, previous: str | Path | None
) -> dict[str, Any]:
    """The schedule state (`DifficultySchedule.to_dict`) a rollout continues: the file
    `previous` (the pipeline passes the previous rollout's schedule.json), or without one the
    schedule.json that rollout `iteration - 1` of this run stored (so a campaign block's first
    rollout continues the last block's); `{}` (a new schedule) when there is none."""
    if previous is not None:
        text = Path(previous).read_text() if Path(previous).exists() else None
    elif iteration > 0:
        uri = _uri(cfg, run_name, iteration - 1, "rollout")
        text = storage.read_text(uri, "schedule.json", cfg.storage.client_config())
    else:
        text = None
    return json.loads(text or "{}")


def _opponent_mix(
    cfg: PipelineConfig,
    num_inits: int,
    iteration: int,
    run_name: str,
    previous: str | Path | None,
) -> OpponentMix:
    """Seat `num_inits` states by the schedule the last rollout left (or a new one)."""
    from sparring.curriculum import DifficultySchedule
    from sparring.games import make_game
    from sparring.opponents import plan_seats

    state = _schedule_state(cfg, run_name, iteration, previous)
    new = DifficultySchedule(cfg.opponents.difficulty)
    schedule = DifficultySchedule.from_dict(state) if state else new
    roles = make_game(cfg.game, **cfg.game_params).roles
    fraction = cfg.opponents.selfplay_fraction
    return OpponentMix(schedule, *plan_seats(num_inits, roles, schedule, fraction, iteration))


def _past_models(
    cfg: PipelineConfig,
    run_name: str,
    iteration: int,
    model_dir: str,
    names: list[str],
    tmp: str | Path,
) -> dict[str, tuple[str, str]]:
    """The `past-<k>` among `names`, each -> (stored URI, local folder) of its checkpoint.

    Rollout i's `past-<k>` is the policy that played rollout i-k: the checkpoint iteration
    i-k-1 trained (`<run>/<i-k-1>/checkpoint`, stored by `register`), or for i <= k the run's
    initial (or warm-started) model, which rollout 0 stores under `<run>/initial` whenever the
    pool names a `past-<k>`. Each URI is downloaded once, into `tmp`."""
    from sparring.opponents import past_steps

    initial = _uri(cfg, run_name, "initial")
    if iteration == 0 and cfg.opponents.checkpoint_steps:
        _upload(cfg, model_dir, initial)  # rollout i resolves past-<k> with k >= i to it
    uris = {
        name: _uri(cfg, run_name, iteration - k - 1, "checkpoint") if iteration > k else initial
        for name in names
        if (k := past_steps(name)) is not None
    }
    local: dict[str, str] = {}
    for uri in sorted(set(uris.values())):
        if iteration == 0:  # every past-<k> is the initial model: the learner's own
            local[uri] = model_dir
        else:
            folder = Path(tmp) / str(len(local))
            local[uri] = str(storage.download_dir(uri, folder, cfg.storage.client_config()))
    for name, uri in sorted(uris.items()):
        log(f"iteration {iteration}: opponent {name} = {uri}")
    return {name: (uri, local[uri]) for name, uri in uris.items()}


def _save_schedule(
    mix: OpponentMix,
    inits: list[tuple[str, dict[str, Any]]],
    iteration: int,
    episodes: list[Any],
    out_dir: str | Path,
    models: dict[str, str],
) -> dict[str, float]:
    """Update the schedule with the learner's rewards; write `schedule.json` (its state and
    history) and `seat_plan.jsonl` (one row per initial state, with its `init_id` and
    `opponent_model`: the stored checkpoint a `past-<k>` opponent resolved to (`models`),
    else None) into `out_dir`; return its `difficulty/<country>` metrics."""
    from sparring.opponents import learner_rewards

    mix.schedule.update(iteration, learner_rewards(episodes))
    out = Path(out_dir)
    (out / "schedule.json").write_text(json.dumps(mix.schedule.to_dict(), indent=1))
    with open(out / "seat_plan.jsonl", "w") as f:
        for row, (init_id, _) in zip(mix.rows, inits, strict=True):
            model = models.get(row["opponent"])
            line = {"iteration": iteration, "init_id": init_id, **row, "opponent_model": model}
            f.write(json.dumps(line) + "\n")
    return mix.schedule.metrics()


def train(
    cfg: PipelineConfig,
    model_dir: str,
    samples: str,
    out_dir: str | Path,
    group_key: str,
    ref_model_dir: str | None = None,
) -> dict[str, float]:
    """GRPO on one rollout's samples; a HF checkpoint in `out_dir`. When every group's rewards
    tie (no signal), the checkpoint is copied unchanged and `train/no_signal` is 1."""
    from sparring.train import NoSignalError
    from sparring.train import train as grpo_train

    tcfg = cfg.train_config(group_key=group_key, device=cfg.device)
    try:
        ref = ref_model_dir if tcfg.kl_coef > 0 else None  # the reference only matters for KL
        return grpo_train(model_dir, [samples], out_dir, tcfg, ref).metrics
    except NoSignalError as e:  # every group tied: no gradient, so the policy stays as it was
        log(f"train: no learning signal, checkpoint unchanged ({e})")
        shutil.copytree(model_dir, out_dir, dirs_exist_ok=True)
        return {"train/no_signal": 1.0, "perf/train_seconds": 0.0}


class VerlLaunchError(RuntimeError):
    """verl's trainer or model merger exited non-zero (the message ends with its output)."""


def verl_launch(
    cfg: PipelineConfig,
    model_dir: str,
    train_inits: str,
    val_inits: str,
    iteration: int,
    games: int,
    work_dir: str | Path,
    scratch_dir: str | Path,
    python: str = sys.executable,
) -> list[str]:
    """Write what verl reads into `work_dir` and return the `python -m verl.trainer.main_ppo`
    argv: data/train.parquet (the iteration's train states x seats, rotating like `rollout`),
    data/val.parquet (every val state x seat) and agent_loops.yaml. verl writes its FSDP
    checkpoints to `scratch_dir/ckpt` (large: kept out of `work_dir`, which is uploaded)."""
    from sparring.rollout import load_inits
    from sparring.verl_backend.data import selfplay_rows, write_rows
    from sparring.verl_backend.launch import verl_command, write_agent_loop_config

    v, work = cfg.verl, Path(work_dir)
    n = games // (v.rollout_n * cfg.num_seats)
    if n * cfg.num_seats < v.train_batch_size:
        raise ValueError(
            f"verl-train: {games} games = {n} states x {cfg.num_seats} seats x rollout_n "
            f"{v.rollout_n} give fewer rows than verl.train_batch_size ({v.train_batch_size})"
        )
    inits = load_inits(train_inits)
    chosen = [inits[(iteration * n + j) % len(inits)] for j in range(n)]
    train = write_rows(
        selfplay_rows(chosen, cfg.game, cfg.game_params, v.group_key),
        work / "data" / "train.parquet",
    )
    val = write_rows(
        selfplay_rows(load_inits(val_inits), cfg.game, cfg.game_params, v.group_key),
        work / "data" / "val.parquet",
    )
    loops = write_agent_loop_config(work / "agent_loops.yaml", v)
    return verl_command(v, model_dir, str(train), str(val), str(scratch_dir), str(loops), python)


def _run_logged(
    cmd: list[str], log_path: Path, what: str, cwd: Path, env: dict[str, str], tail: int = 40
) -> None:
    """Run `cmd`, streaming its output to stdout (the task log) and `log_path`; on a non-zero
    exit raise VerlLaunchError with the last `tail` lines."""
    last: deque[str] = deque(maxlen=tail)
    log(f"{what}: {' '.join(cmd[:3])} ... (log: {log_path})")
    with (
        open(log_path, "w") as f,
        subprocess.Popen(
            cmd,
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
        ) as proc,
    ):
        for line in proc.stdout:
            sys.stdout.write(line)
            f.write(line)
            last.append(line.rstrip("\n"))
    if proc.returncode:
        raise VerlLaunchError(
            f"{what} exited with code {proc.returncode}; nothing was trained or registered. "
            f"Full log: {log_path}. Last {len(last)} lines:\n" + "\n".join(last)
        )


def train_verl(
    cfg: PipelineConfig,
    model_dir: str,
    train_inits: str,
    val_inits: str,
    iteration: int,
    games: int,
    out_dir: str | Path,
    work_dir: str | Path,
    run_name: str | None = None,
    python: str = sys.executable,
) -> dict[str, float]:
    """One iteration on verl (train_backend: verl): build the dataset rows and the agent-loop
    config (`verl_launch`), run verl's main_ppo in a subprocess, merge the latest FSDP actor
    checkpoint into a HF checkpoint at `out_dir` (verl.model_merger), and return verl's last
    logged step metrics as `verl/*` plus `perf/train_seconds`.

    A non-zero exit of either command raises VerlLaunchError with the tail of its output;
    `work_dir` keeps verl.log, merge.log, metrics.jsonl and the data, uploaded to
    `<root>/<run>/<iteration>/verl` when `run_name` is given; the FSDP checkpoints live in a
    temporary folder that is removed afterwards. Tested on CPU only up to the launch (main_ppo
    fails there); the GPU run itself has not been executed.
    """
    from sparring.verl_backend.launch import merge_command

    work = Path(work_dir)
    work.mkdir(parents=True, exist_ok=True)
    metrics_file = work / "metrics.jsonl"
    env = {**os.environ, "VERL_FILE_LOGGER_PATH": str(metrics_file), "HYDRA_FULL_ERROR": "1"}
    with tempfile.TemporaryDirectory(prefix="sparring-verl-") as scratch:
        cmd = verl_launch(
            cfg, model_dir, train_inits, val_inits, iteration, games, work, scratch, python
        )
        t0 = time.perf_counter()
        _run_logged(cmd, work / "verl.log", "verl.trainer.main_ppo", work, env)
        seconds = time.perf_counter() - t0
        merge = merge_command(Path(scratch) / "ckpt", out_dir, python)
        _run_logged(merge, work / "merge.log", "verl.model_merger", work, env)
    out = Path(out_dir)
    if not (out / "config.json").exists():
        raise VerlLaunchError(f"verl.model_merger wrote no config.json into {out}")
    for name in os.listdir(model_dir):  # the merger may not copy the tokenizer: keep ours
        if "token" in name or name in ("chat_template.jinja", "generation_config.json"):
            if not (out / name).exists() and (Path(model_dir) / name).is_file():
                shutil.copy2(Path(model_dir) / name, out / name)
    metrics = verl_metrics(metrics_file)
    metrics["perf/train_seconds"] = seconds
    if run_name:
        _upload(cfg, work, _uri(cfg, run_name, iteration, "verl"))
    log(f"iteration {iteration}: verl trained {metrics.get('verl/step', 0):.0f} steps")
    return metrics


def verl_metrics(path: str | Path) -> dict[str, float]:
    """The last step verl's file logger wrote (`{"step": N, "data": {...}}` per line), as
    `verl/<key>` floats plus `verl/step`; {} when the file is missing or empty."""
    path = Path(path)
    lines = path.read_text().splitlines() if path.exists() else []
    records = [json.loads(line) for line in lines if line.strip()]
    if not records:
        return {}
    last = records[-1]
    out = {  # MLflow metric names allow letters, digits and _-./ (verl uses e.g. "mean@4")
        "verl/" + re.sub(r"[^\w\-./ ]", "_", k): float(v)
        for k, v in last.get("data", {}).items()
        if isinstance(v, int | float) and not isinstance(v, bool)
    }
    out["verl/step"] = float(last.get("step", 0))
    return out


def evaluate(
    cfg: PipelineConfig,
    model_dir: str,
    previous_dir: str | None,
    val_inits: str,
    out_dir: str | Path,
    run_name: str,
    iteration: int,
) -> tuple[dict[str, float], str]:
    """Evaluate on val states; write metrics.json, rewards.png, transcripts.json, upload them.
    Returns (metrics, an HTML report with the plot inline and a few transcripts)."""
    from sparring.evaluate import evaluate as run_eval
    from sparring.evaluate import write_eval
    from sparring.generation.hf import HFBackend

    batch = cfg.eval.max_batch_size
    policy = HFBackend(model_dir, device=cfg.device, max_batch_size=batch)
    previous = (
        HFBackend(previous_dir, device=cfg.device, max_batch_size=batch) if previous_dir else None
    )
    t0 = time.perf_counter()
    metrics, episodes = run_eval(policy, val_inits, cfg.eval, previous, progress=False)
    metrics["perf/eval_seconds"] = time.perf_counter() - t0
    paths = write_eval(metrics, episodes, out_dir)
    _upload(cfg, out_dir, _uri(cfg, run_name, iteration, "eval"))
    log(f"iteration {iteration}: {cfg.champion_metric} = {metrics.get(cfg.champion_metric, 0):.3f}")
    return metrics, eval_report(metrics, paths["plot"], paths["transcripts"], iteration)


def eval_report(
    metrics: dict[str, float], plot: Path, transcripts: Path, iteration: int, turns: int = 8
) -> str:
    """A self-contained HTML page: the reward plot (inline PNG), the reward table and the
    first turns of one sample game per mode."""
    png = base64.b64encode(plot.read_bytes()).decode()
    rows = "".join(
        f"<tr><td>{html.escape(k)}</td><td>{v:.3f}</td></tr>"
        for k, v in sorted(metrics.items())
        if k.endswith("normalized_reward")
    )
    games = []
    for mode, eps in json.loads(transcripts.read_text()).items():
        for ep in eps[:1]:
            lines = "\n".join(
                f"[seat {t['seat']}] {t.get('text', '')}" for t in ep["transcript"][:turns]
            )
            games.append(
                f"<h3>{html.escape(mode)}: {html.escape(ep['game_id'])} rewards {ep['rewards']}</h3>"
                f"<pre>{html.escape(lines)}</pre>"
            )
    return (
        f"<html><body><h2>Iteration {iteration}: evaluation</h2>"
        f'<img src="data:image/png;base64,{png}"/>'
        f"<table border=1><tr><th>metric</th><th>value</th></tr>{rows}</table>"
        f"{''.join(games)}</body></html>"
    )


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
) -> Registered:
    """Upload + verify the checkpoint, log the iteration's metrics and artifacts to its MLflow
    child run, and register the checkpoint (scored by `cfg.champion_metric`).

    The upload comes first: if S3 fails, nothing is logged or registered.
    """
    from sparring.tracking import PipelineRun, register_checkpoint

    uri = _upload(cfg, model_dir, _uri(cfg, run_name, iteration, "checkpoint"))
    run = PipelineRun.attach(parent_run_id, cfg.tracking)
    run.log_metrics(iteration, metrics)
    for path in artifacts:
        run.log_artifact(path, iteration)
    evals = {k: v for k, v in metrics.items() if k.startswith("eval/")}
    if cfg.champion_metric not in evals:
        raise KeyError(
            f"champion_metric {cfg.champion_metric!r} not in eval metrics {sorted(evals)}"
        )
    reg = register_checkpoint(
        cfg.registered_model,
        uri,
        run.iteration_run(iteration),
        iteration,
        evals,
        evals[cfg.champion_metric],
        client=run.client,
        storage_config=cfg.storage.client_config(),
    )
    run.finish()  # ends the child run; the parent stays open until `finish`
    log(
        f"iteration {iteration}: registered {cfg.registered_model} v{reg.version} "
        f"(champion: v{reg.champion_version})"
    )
    return Registered(uri, reg.version, reg.champion_version)


# -- end of the pipeline -----------------------------------------------------------------------


def finish(cfg: PipelineConfig, job_name: str, failed: bool = False) -> str:
    """End the parent run, FINISHED or (when a task failed) FAILED together with any child run
    still open, unless KFP owns it; return a Markdown summary of the run. Runs as the
    pipeline's exit handler, so a failed task never leaves the parent RUNNING."""
    from sparring.tracking import champion, connect

    run_name = cfg.run_name or job_name
    client = connect(cfg.tracking)
    experiment = client.get_experiment_by_name(cfg.tracking.experiment)
    found = experiment and client.search_runs(
        [experiment.experiment_id], f"tags.mlflow.runName = '{run_name}'", max_results=1
    )
    if not found:  # `start` failed before it opened the parent run
        return f"## {run_name}\n\nfailed before the MLflow parent run was opened\n"
    parent_run_id = found[0].info.run_id
    status = "FAILED" if failed else "FINISHED"
    if failed:
        for child in client.search_runs(
            [experiment.experiment_id],
            f"tags.mlflow.parentRunId = '{parent_run_id}' and attributes.status = 'RUNNING'",
        ):
            client.set_terminated(child.info.run_id, status)
    kfp_owns = os.environ.get("MLFLOW_RUN_ID") == parent_run_id  # KFP's MLflow plugin ends it
    if client.get_run(parent_run_id).info.status == "RUNNING" and not kfp_owns:
        client.set_terminated(parent_run_id, status)
    rows = summary_rows(cfg, parent_run_id, client)
    champ = champion(cfg.registered_model, client)
    table = "\n".join(
        f"| {r['iteration']} | {r['rollout']:.3f} | {r['score']:.3f} | {r['version']} |"
        for r in rows
    )
    return (
        f"## {run_name}: {status}\n\n| iteration | rollout reward | {cfg.champion_metric} | "
        f"version |\n|---|---|---|---|\n{table}\n\n"
        f"champion: `models:/{cfg.registered_model}@champion` = v{champ.version if champ else '-'} "
        f"({champ.source if champ else 'none'})\n"
    )


def summary_rows(cfg: PipelineConfig, parent_run_id: str, client: Any) -> list[dict[str, Any]]:
    """Per iteration of the parent run: rollout reward, champion metric, model version, URI."""
    from sparring.tracking import ITERATION_TAG

    parent = client.get_run(parent_run_id)
    children = client.search_runs(
        [parent.info.experiment_id], f"tags.mlflow.parentRunId = '{parent_run_id}'"
    )
    versions = {
        v.run_id: v for v in client.search_model_versions(f"name = '{cfg.registered_model}'")
    }
    rows = []
    for child in children:
        m, version = child.data.metrics, versions.get(child.info.run_id)
        rows.append(
            {
                "iteration": int(child.data.tags[ITERATION_TAG]),
                "rollout": m.get("rollout/normalized_reward", float("nan")),
                "score": m.get(cfg.champion_metric, float("nan")),
                "version": version.version if version else "-",
                "checkpoint": version.source if version else "-",
            }
        )
    return sorted(rows, key=lambda r: r["iteration"])
