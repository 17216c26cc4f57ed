"""`sparring run`'s time estimate and progress lines."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from sparring.loop.config import PipelineConfig
from sparring.loop.estimate import (
    REFERENCE_MATMUL,
    estimate_here,
    estimate_seconds,
    eval_games,
)
from sparring.loop.local import _Progress

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def test_the_embedded_default_is_estimated_within_its_budget():
    cfg = PipelineConfig.from_yaml()
    seconds = estimate_seconds(cfg)
    assert seconds is not None and 5 * 60 < seconds <= 9 * 60  # the README's quick start: ~7 min


def test_more_work_costs_more_and_unmeasured_setups_get_no_estimate():
    cfg = PipelineConfig.from_yaml()
    more = cfg.model_copy(update={"iterations": cfg.iterations + 1})
    assert estimate_seconds(more) > estimate_seconds(cfg)
    assert eval_games(cfg) == cfg.game_init.num_val * (1 + 2 * ("vs_scripted" in cfg.eval.modes))
    assert estimate_seconds(cfg.model_copy(update={"model": "Qwen/Qwen2.5-0.5B"})) is None
    assert estimate_seconds(cfg.model_copy(update={"device": "cuda"})) is None


def test_the_measured_runs_are_estimated_from_their_own_probes():
    """The runs the costs come from (docs/results.md): the full SmolLM2 config took 59:38 on a
    CPU whose matmul probe read 148 GFLOP/s, `make run` 10:49 on one that read 153."""
    smollm2 = PipelineConfig.from_yaml(CONFIGS / "pipeline-smollm2.yaml")
    assert estimate_seconds(smollm2, 148e9) == pytest.approx(59 * 60 + 38, rel=0.05)
    assert estimate_seconds(PipelineConfig.from_yaml(), 153e9) == pytest.approx(649, rel=0.05)


def test_a_slower_cpu_gets_a_proportionally_longer_estimate_from_its_own_probe():
    cfg = PipelineConfig.from_yaml()
    base = estimate_seconds(cfg)
    assert estimate_seconds(cfg, REFERENCE_MATMUL / 2) == pytest.approx(2 * base)
    seconds, matmul = estimate_here(cfg)
    assert 1e9 < matmul < 1e13  # a CPU's fp32 matmul rate, measured here
    assert seconds == pytest.approx(base * REFERENCE_MATMUL / matmul)
    assert estimate_here(cfg.model_copy(update={"device": "cuda"})) is None


def test_progress_echoes_progress_lines_with_elapsed_and_estimated_time():
    log, echo = io.StringIO(), io.StringIO()
    out = _Progress(log, echo, verbose=False, t0=0.0, estimate=605.0)
    out.write("noise\n[sparring] iteration 0: rollout reward 0.412\npartial")
    assert log.getvalue().endswith("partial")  # everything reaches the log
    (line,) = echo.getvalue().splitlines()
    clock, text = line.split("] ", 1)
    assert clock.endswith(" / ~10:05") and text == "[sparring] iteration 0: rollout reward 0.412"
