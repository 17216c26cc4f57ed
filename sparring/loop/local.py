"""`sparring run`: the whole self-play loop on this machine, by default the embedded config.

    sparring run                          # embedded default: tiny model, local S3 + MLflow
    sparring run --config my.yaml --iterations 3
    sparring run --kfp                    # the compiled pipeline under kfp.local instead

By default the loop runs in this process (`sparring.loop.runner.run_loop`); `--kfp` runs the
pipeline `sparring compile` writes under `kfp.local.SubprocessRunner`, every task a subprocess
of this Python (pipelines/local.py; no Docker, no cluster; GPU/K8s settings are ignored). Both
play the same games. When the config's storage is S3 with no endpoint configured (neither
`storage.endpoint_url` nor `AWS_ENDPOINT_URL[_S3]`), a SeaweedFS S3 server is started on
127.0.0.1 with its data in `<workdir>/s3` and stopped on exit. When no MLflow server is
configured (neither `tracking.tracking_uri` nor `MLFLOW_TRACKING_URI`), a local
`mlflow server --serve-artifacts` runs on `<workdir>/mlflow/mlflow.db`, its artifacts in the
storage bucket (or folder); the summary says how to serve it again for the UI.
Full logs go to `<workdir>/<run>/run.log`; the terminal shows progress lines.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from sparring.dev.mlflowserver import ARTIFACT_ROOT
from sparring.loop.config import PipelineConfig
from sparring.loop.services import local_services
from sparring.loop.stop import Stopped, stop_on_signals

if TYPE_CHECKING:
    from sparring.settings import TrackingConfig

# Lines worth showing (the rest, e.g. kfp's executor inputs and progress bars, go to the log).
_PROGRESS = re.compile(r"\[sparring\]|Executing task|finished with status|Error|error:")


class LocalRun(NamedTuple):
    """What a local pipeline run produced."""

    run_name: str  # the display name (the MLflow parent run's); storage keys on the run id
    parent_run_id: str
    rows: list[dict[str, Any]]  # per iteration, see sparring.loop.reports.summary_rows
    champion: Any  # the champion ModelVersion, or None
    test: dict[str, float]  # the test figures (sparring.loop.tasks.evaluate_test), or {}
    tracking_uri: str
    mlflow_ui: str  # how to open the MLflow UI on this run (see `mlflow_ui`)
    storage_root: str  # `<storage.root>/<the run's id>`: its checkpoints, rollouts, evals
    s3_data_dir: Path | None  # where the local S3 server kept its data, if one was started
    log: Path
    seconds: float  # wall time of the whole run, services included
    compute: dict[str, float]  # perf/*_seconds summed over the warm start, evaluations, updates
    peaks: dict[str, float]  # each task kind's peak memory in GiB (tasks.PEAK_METRICS)
    # What `estimate_here` gave at the start: (seconds, this machine's probe, the reference's)
    estimate: tuple[float, Any, Any] | None = None

    @property
    def overhead(self) -> float:
        """Share of the wall time outside the compute (the warm start's SFT, every rollout,
        update and evaluation, the test's included): process start-up, imports, scripted
        teacher games, model load and save, uploads, logging, services."""
        return 1.0 - sum(self.compute.values()) / self.seconds


class _Progress(io.TextIOBase):
    """A stdout that copies everything to a log file and echoes only progress lines, each
    with the time since `t0` and the estimated total (`[m:ss / ~m:ss]`)."""

    def __init__(
        self,
        log: io.TextIOBase,
        echo: io.TextIOBase,
        verbose: bool,
        t0: float,
        estimate: float | None = None,
    ) -> None:
        self.log, self.echo, self.verbose, self._line = log, echo, verbose, ""
        self.t0, self.total = t0, f" / ~{_clock(estimate)}" if estimate else ""

    def write(self, text: str) -> int:
        self.log.write(text)
        self._line += text
        *lines, self._line = self._line.split("\n")
        for line in lines:
            if self.verbose or _PROGRESS.search(line):
                elapsed = _clock(time.perf_counter() - self.t0)
                self.echo.write(f"[{elapsed}{self.total}] {line.strip()}\n")
                self.echo.flush()
        return len(text)

    def flush(self) -> None:
        self.log.flush()


def _clock(seconds: float) -> str:
    """`m:ss`."""
    return f"{int(seconds) // 60}:{int(seconds) % 60:02d}"


Engine = Callable[[PipelineConfig, Path], dict[str, float]]
"""Runs the loop of a config whose services are up, under a work folder; returns the
`perf/*_seconds` it spent and each task kind's peak memory (`tasks.perf_totals`): the
in-process `in_process`, or pipelines/local.py's `run_kfp`."""


def in_process(cfg: PipelineConfig, workdir: Path) -> dict[str, float]:
    """The loop in this process (`sparring.loop.runner.run_loop`)."""
    from sparring.loop.runner import run_loop
    from sparring.loop.tasks import perf_totals

    work = workdir / cfg.run_name / "work"
    result = run_loop(cfg, work)
    warm = work / "warm" / "metrics.json"  # the warm start's SFT counts as train, as on kfp
    reports = [it.metrics for it in [result.start, *result.iterations, result.average] if it] + [
        result.test
    ]
    reports += [json.loads(warm.read_text())] if cfg.warm_start else []
    return perf_totals(reports)


def run_local(
    cfg: PipelineConfig,
    workdir: str | Path = "runs",
    verbose: bool = False,
    engine: Engine = in_process,
) -> LocalRun:
    """Run the loop for `cfg` on this machine with `engine`; see the module docstring."""
    from sparring.loop import runs
    from sparring.loop.estimate import estimate_here
    from sparring.loop.reports import summary_rows, test_figures
    from sparring.loop.tasks import COMPUTE_METRICS, PEAK_METRICS
    from sparring.registry import champion
    from sparring.tracking import connect

    t0, started = time.perf_counter(), time.time()
    workdir = Path(workdir).resolve()
    run_name = cfg.run_name or f"{cfg.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    (workdir / run_name).mkdir(parents=True, exist_ok=True)
    log_path = workdir / run_name / "run.log"
    estimate = estimate_here(cfg)  # (seconds, this machine's probe, the reference's) or None
    seconds = estimate[0] if estimate else None
    if estimate:
        _, here, ref = estimate
        print(
            f"[sparring] estimated time: ~{_clock(seconds)} if these cores are idle (this CPU "
            f"runs {cfg.model}'s update {ref.train / here.train:.2f}x and its decoding "
            f"{ref.decode / here.decode:.2f}x as fast as where the costs were measured)",
            flush=True,
        )
    own_mlflow = not cfg.tracking.tracking_uri and "MLFLOW_TRACKING_URI" not in os.environ
    with (
        stop_on_signals(),  # a signal while the services start or report stops them
        local_services(cfg.model_copy(update={"run_name": run_name}), workdir) as (cfg, s3_dir),
    ):
        with (
            log_path.open("w") as log,
            contextlib.redirect_stdout(_Progress(log, sys.stdout, verbose, t0, seconds)),
            contextlib.redirect_stderr(_Progress(log, sys.stderr, verbose, t0, seconds)),
            stop_on_signals(),
        ):
            try:
                perf = engine(cfg, workdir)
            except Stopped as e:  # SIGTERM/SIGINT: the task is gone; services stop on exit
                parent = _this_parent(cfg, connect(cfg.tracking), started)
                if parent is not None:
                    runs.end(connect(cfg.tracking), parent, "KILLED")
                key = parent.data.tags[runs.RUN_TAG] if parent else "<not started>"
                e.partial = f"{cfg.storage.root.rstrip('/')}/{key}" + (
                    f" (local S3 data in {s3_dir})" if s3_dir else ""
                )
                raise
        client = connect(cfg.tracking)
        parent = _this_parent(cfg, client, started)
        rows = summary_rows(cfg, parent.info.run_id, client)
        return LocalRun(
            run_name,
            parent.info.run_id,
            rows,
            champion(cfg.registered_model, client),
            test_figures(parent.info.run_id, client),
            cfg.tracking.resolved_uri(),
            mlflow_ui(cfg.tracking, workdir / "mlflow" if own_mlflow else None),
            f"{cfg.storage.root.rstrip('/')}/{parent.data.tags[runs.RUN_TAG]}",
            s3_dir,
            log_path,
            time.perf_counter() - t0,
            {k: perf[k] for k in COMPUTE_METRICS},
            {k: perf[k] for k in PEAK_METRICS if perf.get(k)},
            estimate,
        )


def _this_parent(cfg: PipelineConfig, client: Any, started: float) -> Any:
    """The MLflow parent run `run_local` opened: the newest of this pipeline, if it started
    after `started` (epoch seconds), else None. Its `sparring.run` tag is the storage key (the
    run's unique id, which only the engine knows)."""
    from sparring.loop import runs

    parent = runs.find_parent(cfg, client, cfg.name, tag=runs.PIPELINE_TAG)
    return parent if parent and parent.info.start_time >= int(started * 1000) else None


def format_summary(result: LocalRun, cfg: PipelineConfig, result_name: str) -> str:
    """The table `sparring run` prints at the end: one row per evaluation (the first the
    start's, before any update, with `evaluate_start`), the game's baselines on the same
    states, the champion and the test; with a test, it ends with the lines
    `RESULT <result_name>_test_gain` and `..._test_gain_se` (final - start on test, paired)."""
    from sparring.loop.reports import iteration_label, test_line

    metric = cfg.champion_metric
    lines = [
        f"run {result.run_name}: {cfg.iterations} iterations in {result.seconds:.0f} s",
        f"{'iter':>5}  {'rollout reward':>14}  {metric:>36}  {'version':>7}  checkpoint",
    ]
    for r in result.rows:
        lines.append(
            f"{iteration_label(cfg, r['iteration'], r['member']):>5}  {r['rollout']:>14.3f}  "
            f"{r['score']:>36.3f}  {r['version']:>7}  {r['checkpoint']}"
        )
    baselines = next((r["baselines"] for r in reversed(result.rows) if r["baselines"]), {})
    if baselines:
        lines.append(
            "baselines on the same val states: "
            + ", ".join(f"{name} {value:.3f}" for name, value in baselines.items())
        )
    champ = result.champion
    peaks = ", ".join(  # perf/<task>_peak_rss_gib -> <task>
        f"{k.removeprefix('perf/').removesuffix('_peak_rss_gib')} {v:.1f}"
        for k, v in result.peaks.items()
    )
    lines += [
        f"champion: v{champ.version} ({champ.source})" if champ else "champion: none",
        *([test_line(cfg, result.test)] if result.test else []),
        f"artifacts: {result.storage_root}/"
        + (f"  (local S3 data in {result.s3_data_dir})" if result.s3_data_dir else ""),
        f"task logs: {result.log}",
        f"compute {sum(result.compute.values()):.0f} s of {result.seconds:.0f} s wall "
        f"(pipeline overhead {result.overhead:.2f})"
        + (f"; estimated ~{_clock(result.estimate[0])} at the start" if result.estimate else ""),
        *([f"peak memory by task: {peaks} GiB"] if peaks else []),
        f"MLflow UI: {result.mlflow_ui}  (parent run {result.parent_run_id})",
    ]
    if result.test:
        lines += [
            f"RESULT {result_name}_test_gain {result.test['test/gain']:.4f}",
            f"RESULT {result_name}_test_gain_se {result.test['test/gain_se']:.4f}",
        ]
    return "\n".join(lines)


def mlflow_ui(tracking: TrackingConfig, local_server_dir: Path | None) -> str:
    """How to open the MLflow UI on a finished run: the server's URL; for the local server
    `sparring run` started in `local_server_dir` (stopped with the run), the command that
    serves its store again the same way; for a sqlite store, `mlflow ui` on it."""
    uri = tracking.resolved_uri()
    if local_server_dir is not None:
        return (
            f"mlflow server --backend-store-uri sqlite:///{local_server_dir / 'mlflow.db'} "
            f"--serve-artifacts --artifacts-destination {tracking.artifacts_destination} "
            f"--default-artifact-root {ARTIFACT_ROOT}, then open http://127.0.0.1:5000"
        )
    if uri.startswith(("http://", "https://")):
        return f"open {uri}"
    return f"mlflow ui --backend-store-uri {uri}, then open http://127.0.0.1:5000"
