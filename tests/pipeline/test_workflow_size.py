"""The per-run iteration cap (sparring.pipelines.workflow_size) and `sparring submit` splitting a
longer run into a campaign of blocks no larger than it.

The cap comes from two real compiles of a shipped config; a compile at the cap must estimate
under the budget and one at cap + 1 over it, so the cap, the growth and the estimate agree.
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
    estimate_workflow_bytes,
    max_iterations,
    measure,
)
from test_run_identity import FakeKfp

from sparring.cli import submit as submit_cli
from sparring.loop.config import CONFIG_DIR, PipelineConfig

BUDGET = workflow_size.LIMIT * (1 - workflow_size.MARGIN)


def shipped(name: str) -> PipelineConfig:
    return PipelineConfig.model_validate(yaml.safe_load((CONFIG_DIR / name).read_text()))


def test_cap_from_the_growth_by_hand():
    # budget 0.9 x 1,000,000 = 900,000; 500,000 + 2 x 200,000 = 900,000 fits, a 4th doesn't
    g = Growth(ir_base=0, ir_per_iteration=0, workflow_base=500_000, workflow_per_iteration=200_000)
    assert g.cap(limit=1_000_000, margin=0.1) == 3
    assert g.workflow_bytes(3) == 900_000
    assert Growth(0, 0, 950_000, 1).cap(limit=1_000_000, margin=0.1) == 0  # 1 doesn't fit


# the GPU example (torch backend, cap 1) and verl's (fewer tasks per iteration, cap above 1)
@pytest.mark.parametrize("name", ["pipeline-gpu.yaml", "examples/verl.yaml"])
def test_the_cap_of_a_shipped_config_matches_compiles_at_cap_and_cap_plus_one(name, tmp_path):
    cfg = shipped(name)
    growth = measure(cfg)
    cap = max_iterations(cfg)
    assert cap >= 1 and cap == growth.cap()
    # each iteration adds 3-4 tasks, each holding its pod-spec patch several times over
    assert growth.workflow_per_iteration > 4 * growth.ir_per_iteration > 0
    sizes = {}
    for n in (cap, cap + 1):
        package = compile_pipeline(
            cfg.model_copy(update={"iterations": n}), str(tmp_path / f"{n}.yaml")
        )
        sizes[n] = estimate_workflow_bytes(package)
        # the growth is linear: the two-compile extrapolation matches a real compile to 1%
        assert sizes[n] == pytest.approx(growth.workflow_bytes(n), rel=0.01)
    assert sizes[cap] <= BUDGET < sizes[cap + 1]


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

    cap = max_iterations(PipelineConfig.model_validate(yaml.safe_load(config.read_text())))
    args = ["--host", "http://kfp", "--config", str(config), "--campaign", "9"]
    bad = CliRunner().invoke(submit_cli.command, [*args, "--block", str(cap + 1)])
    assert bad.exit_code == 2 and f"over the cap of {cap}" in bad.output
    assert len(client.runs) == 1  # nothing submitted
