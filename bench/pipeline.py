"""Wall time of the default 2-iteration local pipeline, and the share of it that is overhead.

    .venv/bin/python bench/pipeline.py                       # the embedded default (`sparring run`)
    .venv/bin/python bench/pipeline.py --config my.yaml

Runs `sparring run`'s pipeline in a fresh work folder (local SeaweedFS S3, sqlite MLflow, every
task a kfp.local subprocess). Compute = the rollout, train (GRPO and the SFT warm start) and
eval seconds the steps report (`perf/*_seconds`); overhead = everything else: process
start-up, imports, model load and save, uploads, MLflow logging, service start-up. Prints the
wall time, then `RESULT pipeline_overhead <share>`.
"""

from __future__ import annotations

import argparse
import tempfile

from sparring.pipelines.local import run_kfp

from sparring.loop.config import PipelineConfig
from sparring.loop.local import run_local


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", help="PipelineConfig YAML (default: configs/pipeline.yaml)")
    args = ap.parse_args()
    cfg = PipelineConfig.from_yaml(args.config)
    with tempfile.TemporaryDirectory(prefix="sparring-bench-") as workdir:
        result = run_local(cfg, workdir, engine=run_kfp)
    for name, seconds in result.compute.items():
        print(f"{name:>24}: {seconds:7.1f} s")
    print(f"{'compute':>24}: {sum(result.compute.values()):7.1f} s")
    print(f"{'wall time':>24}: {result.seconds:7.1f} s ({cfg.iterations} iterations)")
    print(f"RESULT pipeline_overhead {result.overhead:.3f}")


if __name__ == "__main__":
    main()
