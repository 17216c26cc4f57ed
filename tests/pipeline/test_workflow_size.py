"""The per-run iteration cap (sparring.pipelines.workflow_size) and `sparring submit` splitting a
longer run into a campaign of blocks no larger than it.

The cap (a run past it fails) and the retryable length (a run past it can't be retried from the
KFP UI) come from two real compiles of a config; compiles at each bound and one past it must
fall either side of the budget, so the bounds, the growth and the estimate agree.
"""

from __future__ import annotations

from pathlib import Path

import kfp
import pytest
import yaml
from click.testing import CliRunner
from sparring.pipelines import workflow_size
from sparring.pipelines.selfplay import compile_pipeline
from sparring.pipelines.workflow_size import (
    Growth,
    compressed_workflow_bytes,
    estimate_workflow_bytes,
    max_iterations,
    measure,
    retryable_iterations,
)
from test_run_identity import FakeKfp

from sparring.cli import submit as submit_cli
from sparring.loop.config import CONFIG_DIR, PipelineConfig

BUDGET = workflow_size.LIMIT * (1 - workflow_size.MARGIN)


def shipped(name: str) -> PipelineConfig:
    return PipelineConfig.model_validate(yaml.safe_load((CONFIG_DIR / name).read_text()))


def compiled(cfg: PipelineConfig, lengths, size, tmp_path: Path) -> dict[int, int]:
    """{iterations: size(the compiled pipeline)} of `cfg` at each of `lengths`."""
    return {
        n: size(
            compile_pipeline(cfg.model_copy(update={"iterations": n}), str(tmp_path / f"{n}.yaml"))
        )
        for n in lengths
    }


def test_cap_from_the_growth_by_hand():
    # whole: 500,000 + 200,000/it.; compressed: 100,000 + 20,000/it.; limits 1,000,000 x 0.9
    g = Growth(0, 0, 500_000, 200_000, 100_000, 20_000)
    assert g.retryable(limit=1_000_000, margin=0.1) == 3  # 500,000 + 2 x 200,000 = 900,000
    assert g.workflow_bytes(3) == 900_000
    assert g.stored_bytes(3, limit=1_000_000) == 900_000  # under the limit: not compressed
    assert g.stored_bytes(4, limit=1_000_000) == 160_000  # over: Argo compresses the status
    assert g.cap(limit=1_000_000, margin=0.1) == 41  # 100,000 + 40 x 20,000 = 900,000
    assert Growth(0, 0, 950_000, 1, 950_000, 1).cap(limit=1_000_000, margin=0.1) == 0


def test_the_gpu_configs_cap_matches_compiles_at_cap_and_cap_plus_one(tmp_path):
    """The cap (a run past it fails) from two compiles agrees with real compiles at the cap and
    one past it. The linear extrapolation of the compressed size is never under them and over
    by at most 2% (gzip finds a few repeats across iterations, so the real growth slows)."""
    cfg = shipped("pipeline-gpu.yaml")
    growth = measure(cfg)
    cap = max_iterations(cfg)
    assert cap == growth.cap() > cfg.iterations  # the shipped 10 iterations fit one run
    # each iteration adds 3-4 tasks, each holding its pod-spec patch several times over
    assert growth.workflow_per_iteration > 4 * growth.ir_per_iteration > 0
    assert growth.compressed_per_iteration < growth.workflow_per_iteration / 4  # gzip
    sizes = compiled(cfg, (cap, cap + 1), compressed_workflow_bytes, tmp_path)
    for n, size in sizes.items():
        assert 0.98 * growth.stored_bytes(n) <= size <= growth.stored_bytes(n)
    # a run at the cap fits; one past it the estimate is over, and the real size is over or
    # within the estimate's 1% of the budget (the cap is exact or one short, never too long)
    assert sizes[cap] <= BUDGET < growth.stored_bytes(cap + 1)
    assert sizes[cap + 1] > BUDGET * 0.99


# the GPU example (torch backend) and verl's (fewer tasks per iteration, more per run)
@pytest.mark.parametrize("name", ["pipeline-gpu.yaml", "examples/verl.yaml"])
def test_the_retryable_runs_of_a_shipped_config_match_compiles(name, tmp_path):
    """A run of `retryable_iterations` stays under etcd's 1.5 MiB uncompressed (a retry from the
    KFP UI writes it back whole), one more iteration passes it."""
    cfg = shipped(name)
    growth = measure(cfg)
    n = retryable_iterations(cfg)
    assert n == growth.retryable() >= 1
    budget = workflow_size.RETRY_LIMIT * (1 - workflow_size.MARGIN)
    sizes = compiled(cfg, (n, n + 1), estimate_workflow_bytes, tmp_path)
    for k, size in sizes.items():
        assert size == pytest.approx(growth.workflow_bytes(k), rel=0.01)
    assert sizes[n] <= budget < sizes[n + 1]


def test_the_estimate_grows_with_the_config_every_task_receives(tmp_path):
    """Each task's executor input carries the whole config JSON (`start` passes it on as
    `run_config`), and Argo's status holds each task's pod-spec patch 4 times (driver output,
    executor DAG, Retry node, pod): 1000 more bytes of config add 4000+ per such task."""
    cfg = shipped("pipeline-gpu.yaml").model_copy(update={"iterations": 1})
    small = compile_pipeline(cfg, str(tmp_path / "a.yaml"))
    longer = cfg.model_copy(update={"run_name": "x" * 1000})
    large = compile_pipeline(longer, str(tmp_path / "b.yaml"))
    ir = yaml.safe_load(Path(small).read_text().split("\n---\n")[0])
    dags = [c["dag"]["tasks"] for c in [ir["root"], *ir["components"].values()] if "dag" in c]
    with_config = sum("config" in t["inputs"]["parameters"] for d in dags for t in d.values()
                      if "parameters" in t.get("inputs", {}))  # fmt: skip
    assert with_config >= 6  # start, game-init, initial-model, rollout, train, evaluate, ...
    grown = estimate_workflow_bytes(large) - estimate_workflow_bytes(small)
    assert grown >= 4 * 1000 * with_config


def tiny_config(tmp_path: Path, iterations: int) -> Path:
    path = tmp_path / "pipeline.yaml"
    data = {
        "name": "nightly",
        "iterations": iterations,
        "games_per_iteration": 4,
        "game_init": {"num_train": 4, "num_val": 1},
        "storage": {"root": str(tmp_path / "store")},
        "tracking": {"enabled": False},
    }
    path.write_text(yaml.safe_dump(data))
    return path


def test_submit_splits_iterations_over_the_cap_into_one_campaign(tmp_path, monkeypatch):
    probe = tiny_config(tmp_path, 1)
    cap = max_iterations(PipelineConfig.model_validate(yaml.safe_load(probe.read_text())))
    iterations = 2 * cap + 1  # three runs: cap, cap, 1
    config = tiny_config(tmp_path, iterations)
    client = FakeKfp()
    monkeypatch.setattr(kfp, "Client", lambda host, namespace=None: client)

    result = CliRunner().invoke(
        submit_cli.command, ["--host", "http://kfp", "--config", str(config)]
    )
    assert result.exit_code == 0, result.output
    assert "submitting a campaign of 3 runs" in result.output
    runs = [c for _, c in client.runs]
    assert [(c.first_iteration, c.iterations) for c in runs] == [
        (0, cap),
        (cap, cap),
        (2 * cap, 1),
    ]
    assert len({c.campaign for c in runs}) == 1 and runs[0].campaign.startswith("nightly-")
    champion = f"models:/{runs[0].registered_model}@champion"
    assert runs[0].model != champion == runs[1].model == runs[2].model
    assert result.output.count(" done") == 3


def test_submit_keeps_a_run_within_the_cap_whole_and_refuses_a_larger_block(tmp_path, monkeypatch):
    config = tiny_config(tmp_path, 1)
    client = FakeKfp()
    monkeypatch.setattr(kfp, "Client", lambda host, namespace=None: client)
    ok = CliRunner().invoke(submit_cli.command, ["--host", "http://kfp", "--config", str(config)])
    assert ok.exit_code == 0, ok.output
    assert "created run kfp-run-1" in ok.output and len(client.runs) == 1
    assert "warning" not in ok.output  # one iteration: retryable from the UI

    probe = PipelineConfig.model_validate(yaml.safe_load(config.read_text()))
    longer = tiny_config(tmp_path, retryable_iterations(probe) + 1)  # within the cap
    warned = CliRunner().invoke(
        submit_cli.command, ["--host", "http://kfp", "--config", str(longer)]
    )
    assert warned.exit_code == 0 and len(client.runs) == 2  # one more run, whole
    assert "can't be retried from the KFP UI" in warned.output

    cap = max_iterations(PipelineConfig.model_validate(yaml.safe_load(config.read_text())))
    args = ["--host", "http://kfp", "--config", str(config), "--campaign", "9"]
    bad = CliRunner().invoke(submit_cli.command, [*args, "--block", str(cap + 1)])
    assert bad.exit_code == 2 and f"over the cap of {cap}" in bad.output
    assert len(client.runs) == 2  # nothing more submitted
