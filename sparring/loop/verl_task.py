"""The pipeline's verl task (`train_backend: verl`): one iteration of online self-play and
training inside verl's `main_ppo`, then its FSDP checkpoint merged into a HF checkpoint.

    metrics = train_verl(cfg, model_dir, train_inits, val_inits, iteration, games, out, work)
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

from sparring.loop.config import PipelineConfig
from sparring.loop.io import log, run_uri, upload
from sparring.loop.steps import rotate
from sparring.rollout import load_inits
from sparring.verl_backend.data import selfplay_rows, write_rows
from sparring.verl_backend.launch import merge_command, verl_command, write_agent_loop_config


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
    v, work = cfg.verl, Path(work_dir)
    n = games // (v.rollout_n * cfg.num_seats)
    if n * cfg.num_seats < v.train_batch_size:
        raise ValueError(
            f"verl-train: {games} games = {n} states x {cfg.num_seats} seats x rollout_n "
            f"{v.rollout_n} give fewer rows than verl.train_batch_size ({v.train_batch_size})"
        )
    inits = load_inits(train_inits)
    chosen = rotate(inits, iteration, n)
    train = write_rows(
        selfplay_rows(chosen, cfg.game, v.group_key),
        work / "data" / "train.parquet",
    )
    val = write_rows(
        selfplay_rows(load_inits(val_inits), cfg.game, v.group_key),
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
    client: object = None,
    overrides: Sequence[str] = (),
) -> dict[str, float]:
    """One iteration on verl (train_backend: verl): build the dataset rows and the agent-loop
    config (`verl_launch`), run verl's main_ppo in a subprocess, merge the latest FSDP actor
    checkpoint into a HF checkpoint at `out_dir` (verl.model_merger), and return verl's last
    logged step metrics as `verl/*` plus `perf/train_seconds`.

    A non-zero exit of either command raises VerlLaunchError with the tail of its output;
    `work_dir` keeps verl.log, merge.log, metrics.jsonl and the data, uploaded to
    `<root>/<run>/<iteration>/verl` when `run_name` is given; the FSDP checkpoints live in a
    temporary folder that is removed afterwards. With `verl.nnodes` > 1 main_ppo runs as a
    KubeRay RayJob instead (`_train_on_rayjob`; `client`: a kubernetes ApiClient, None = the
    pod's ServiceAccount) and the checkpoints go through the shared volume. `overrides`: more
    Hydra overrides of main_ppo (keys of verl's ppo_trainer.yaml), after Sparring's own.
    Tested on CPU up to the point where verl needs a GPU, and the RayJob against a fake API
    server; the GPU run itself has not been executed.
    """
    work = Path(work_dir)
    work.mkdir(parents=True, exist_ok=True)
    metrics_file = work / "metrics.jsonl"
    env = {**os.environ, "VERL_FILE_LOGGER_PATH": str(metrics_file), "HYDRA_FULL_ERROR": "1"}
    with _scratch(cfg, run_name or "run", iteration) as scratch:
        t0 = time.perf_counter()
        if cfg.verl.nnodes > 1:
            _train_on_rayjob(
                cfg,
                model_dir,
                (train_inits, val_inits),
                iteration,
                games,
                work,
                scratch,
                run_name,
                client,
                overrides,
            )
        else:
            cmd = verl_launch(
                cfg, model_dir, train_inits, val_inits, iteration, games, work, scratch, python
            )
            _run_logged([*cmd, *overrides], work / "verl.log", "verl.trainer.main_ppo", work, env)
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
        upload(cfg, work, run_uri(cfg, run_name, iteration, "verl"))
    log(f"iteration {iteration}: verl trained {metrics.get('verl/step', 0):.0f} steps")
    return metrics


@contextmanager
def _scratch(cfg: PipelineConfig, run_name: str, iteration: int) -> Iterator[Path]:
    """Where verl writes its FSDP checkpoints, removed afterwards: a temporary folder, or with
    nnodes > 1 `<verl.rayjob.shared_path>/<run>/<iteration>` on the volume every Ray pod
    mounts (the model and the dataset rows are staged there too)."""
    if cfg.verl.nnodes == 1:
        with tempfile.TemporaryDirectory(prefix="sparring-verl-") as tmp:
            yield Path(tmp)
        return
    stage = Path(cfg.verl.rayjob.shared_path) / run_name / str(iteration)
    shutil.rmtree(stage, ignore_errors=True)  # a retried task starts clean
    stage.mkdir(parents=True)
    try:
        yield stage
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def _train_on_rayjob(
    cfg: PipelineConfig,
    model_dir: str,
    inits: tuple[str, str],
    iteration: int,
    games: int,
    work: Path,
    stage: Path,
    run_name: str | None,
    client: object = None,
    overrides: Sequence[str] = (),
) -> None:
    """verl.nnodes > 1: stage the model and verl's inputs on the shared volume, run main_ppo as
    a KubeRay RayJob (sparring.verl_backend.rayjob) with its log in `work/verl.log`, and copy
    back what is uploaded (data, agent-loop config, metrics.jsonl); the checkpoint stays in
    `stage/ckpt` for the merge."""
    from sparring.verl_backend import rayjob

    model = shutil.copytree(model_dir, stage / "model")
    cmd = verl_launch(cfg, str(model), *inits, iteration, games, stage, stage, "python")
    cmd += overrides
    env = {"VERL_FILE_LOGGER_PATH": str(stage / "metrics.jsonl"), "HYDRA_FULL_ERROR": "1"}
    r = cfg.verl.rayjob
    manifest = rayjob.rayjob_manifest(
        rayjob.rayjob_name(run_name or "run", iteration),
        rayjob.own_namespace(r),
        cmd,
        env,
        cfg.kubernetes.gpu_image,
        cfg.verl,
        cfg.kubernetes,
    )
    with open(work / "verl.log", "w") as f:
        rayjob.run_rayjob(client or rayjob.api_client(), manifest, r, out=_Tee(sys.stdout, f))
    for name in ("data", "agent_loops.yaml", "metrics.jsonl"):
        src = stage / name
        if src.is_dir():
            shutil.copytree(src, work / name, dirs_exist_ok=True)
        elif src.exists():
            shutil.copy2(src, work / name)


class _Tee:
    """A text stream writing to several streams."""

    def __init__(self, *streams: TextIO) -> None:
        self.streams = streams

    def write(self, text: str) -> int:
        for s in self.streams:
            s.write(text)
        return len(text)

    def flush(self) -> None:
        for s in self.streams:
            s.flush()


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
