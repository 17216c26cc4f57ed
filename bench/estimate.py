"""`sparring run`'s time estimate against the run it estimates, and the costs that run measured.

    .venv/bin/python bench/estimate.py                   # the embedded default (`make run`)
    taskset -c 0 .venv/bin/python bench/estimate.py      # the same on one core: a slower machine
    .venv/bin/python bench/estimate.py --config configs/pipeline-smollm2.yaml --set iterations=1

Runs the config in-process as `sparring run` does, which first probes this machine with the
model's own work and prints its estimate (`sparring.loop.estimate`). Then prints this
machine's probe against the reference, the seconds spent by kind (the warm start's SFT,
rollouts, updates, evaluations, and the rest per task), each task's peak memory, the model's
costs as this run measured them (`fitted: Costs(...)`, with this machine's probe as the
reference: paste it into `COSTS`, or `COSTS_BF16` for a config decoding in bf16, to refit),
and last `RESULT estimate_over_wall <printed estimate / wall time>`.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from sparring.cli.options import load_config, parse_params
from sparring.loop.config import DEFAULT_CONFIG, PipelineConfig
from sparring.loop.estimate import COSTS, Costs, costs_for, work
from sparring.loop.local import run_local


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", help="PipelineConfig YAML (default: configs/pipeline.yaml)")
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config field (dotted keys, YAML values); repeatable",
    )
    args = ap.parse_args()
    cfg = load_config(
        PipelineConfig, args.config or str(DEFAULT_CONFIG), parse_params(tuple(args.set))
    )
    if (costs := costs_for(cfg)) is None:
        ap.error(f"no measured costs for model {cfg.model!r}: the estimate covers {sorted(COSTS)}")
    with tempfile.TemporaryDirectory(prefix="sparring-bench-") as workdir:
        run = run_local(cfg, workdir)
        warm = Path(workdir) / run.run_name / "work" / "warm" / "metrics.json"
        sft = json.loads(warm.read_text())["perf/train_seconds"] if cfg.warm_start else 0.0
    estimate, here, _ = run.estimate  # the run's own probe: the fit's reference
    w = work(cfg, costs.budget)
    spent = {
        "sft": sft,
        "rollout": run.compute["perf/rollout_seconds"],
        "train": run.compute["perf/train_seconds"] - sft,
        "eval": run.compute["perf/eval_seconds"],
    }
    spent["task"] = run.seconds - sum(spent.values())
    fitted = Costs(
        **{k: v / max(getattr(w, "tasks" if k == "task" else k), 1e-9) for k, v in spent.items()},
        budget=costs.budget,
        rows=costs.rows,
        reference=here,
    )
    scale = {
        "update": costs.reference.train / here.train,
        "decode": costs.reference.decode / here.decode,
    }
    print(f"probe here: {here} ({scale['update']:.2f}x and {scale['decode']:.2f}x the reference)")
    for kind, seconds in spent.items():
        print(f"{kind:>8}: {seconds:7.1f} s measured")
    print("peak memory by task: " + ", ".join(f"{k} {v:.2f} GiB" for k, v in run.peaks.items()))
    print(f"fitted: {fitted}")
    print(f"estimated {estimate:.0f} s at the start, wall {run.seconds:.0f} s")
    print(f"RESULT estimate_over_wall {estimate / run.seconds:.3f}")


if __name__ == "__main__":
    main()
