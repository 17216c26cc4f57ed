"""`sparring run --kfp`: the compiled pipeline under kfp.local, one subprocess per task.

    run_local(cfg, "runs", engine=run_kfp)          # sparring.loop.local.run_local

The pipeline is the one `sparring compile` writes (`build_pipeline`); the local services and
the summary are `sparring.loop.local`'s, shared with the in-process loop.
"""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

from sparring.pipelines.selfplay import build_pipeline

from sparring.loop.config import PipelineConfig


def run_kfp(cfg: PipelineConfig, workdir: Path) -> dict[str, float]:
    """Run the pipeline for `cfg` (its services up) under kfp.local, outputs under
    `workdir/kfp`; return the `perf/*_seconds` its tasks reported. A failed task raises
    RuntimeError with the end of its log."""
    from kfp import local

    # kfp warns that our image is "non-Python": it is ours, and this Python has it installed.
    # It also warns that display names and K8s settings are ignored: that is expected.
    warnings.filterwarnings("ignore", message=".*non-Python base image.*")
    warnings.filterwarnings("ignore", message=".*have no effect in the current local runner.*")
    _keep_loop_inputs()
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(workdir / "kfp"))
    log_path = workdir / cfg.run_name / "run.log"
    try:
        build_pipeline(cfg)()
    except RuntimeError as e:
        raise RuntimeError(
            f"{e}\n--- end of the failed task's log ({log_path}) ---\n"
            + failed_task_log(log_path.read_text(errors="replace"))
        ) from e
    job_dir = max((workdir / "kfp").iterdir(), key=lambda p: p.stat().st_mtime)
    return perf_totals(job_dir)


def _keep_loop_inputs() -> None:
    """Work around a kfp.local 2.17 bug: each iteration of a `ParallelFor` over constant items
    gets the loop item in place of EVERY task-output parameter the loop consumes (so the shard
    tasks of `rollout.shards` got their index as `config`). Put back the inputs that do not feed
    the iterator. The cluster backend resolves them correctly; idempotent."""
    from kfp.local.orchestrator import task_spec_utils

    make = task_spec_utils.create_parameter_loop_iteration_task_spec
    if getattr(make, "keeps_loop_inputs", False):
        return

    def fixed(task_spec, loop_item, loop_task_name):
        spec = make(task_spec, loop_item, loop_task_name)
        items = task_spec.parameter_iterator.items.input_parameter
        for name, given in task_spec.inputs.parameters.items():
            if given.HasField("task_output_parameter") and name != items:
                spec.inputs.parameters[name].CopyFrom(given)
        return spec

    fixed.keeps_loop_inputs = True
    task_spec_utils.create_parameter_loop_iteration_task_spec = fixed


def perf_totals(job_dir: Path) -> dict[str, float]:
    """`tasks.perf_totals` over the output artifacts of every task of one kfp.local job (the
    warm start's SFT counts as train)."""
    from sparring.loop import tasks

    return tasks.perf_totals(
        [
            a.get("metadata", {})
            for out in job_dir.glob("*/executor_output.json")
            for artifact in json.loads(out.read_text()).get("artifacts", {}).values()
            for a in artifact["artifacts"]
        ]
    )


def failed_task_log(log: str, lines: int = 40) -> str:
    """The last `lines` lines of the first failed task's output in a kfp.local log (tasks run
    one at a time), or of the whole log when no task is marked failed."""
    plain = re.sub(r"\x1b\[[0-9;]*m", "", log).splitlines()
    start = 0
    for i, line in enumerate(plain):
        if "Executing task" in line:
            start = i
        elif re.search(r"Task '[^']+' finished with status FAILURE", line):
            return "\n".join(plain[max(start, i + 1 - lines) : i + 1])
    return "\n".join(plain[-lines:])
