"""`sparring run`'s time estimate and progress lines."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from sparring.pipeline.config import PipelineConfig
from sparring.pipeline.estimate import (
    REFERENCE_MATMUL,
    estimate_here,
    estimate_seconds,
    eval_games,
)
from sparring.pipeline.local import _Progress

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


def test_the_real_model_config_is_estimated_from_its_shortened_run():
    """configs/pipeline-smollm2.yaml: the shortened run its costs come from took 9:08
    (docs/results.md); the full config ~55 min, as the README says."""
    cfg = PipelineConfig.from_yaml(CONFIGS / "pipeline-smollm2.yaml")
    short = cfg.model_copy(
        update={
            "iterations": 1,
            "games_per_iteration": 32,
            "game_init": cfg.game_init.model_copy(update={"num_val": 32}),
        }
    )
    assert abs(estimate_seconds(short) - 548) < 60
    assert 50 * 60 < estimate_seconds(cfg) < 60 * 60


def test_a_slower_cpu_gets_a_proportionally_longer_estimate_from_its_own_probe():
    """The 2-iteration SmolLM2 run that took 27:33 was estimated at ~15:20 on a CPU whose
    matmul measured 133 GFLOP/s; scaled, the estimate is 24:49, 10% under what it took."""
    cfg = PipelineConfig.from_yaml()
    base = estimate_seconds(cfg)
    assert estimate_seconds(cfg, REFERENCE_MATMUL / 2) == pytest.approx(2 * base)
    seconds, matmul = estimate_here(cfg)
    assert 1e9 < matmul < 1e13  # a CPU's fp32 matmul rate, measured here
    assert seconds == pytest.approx(base * REFERENCE_MATMUL / matmul)
    assert estimate_here(cfg.model_copy(update={"device": "cuda"})) is None

    smollm2 = PipelineConfig.from_yaml(CONFIGS / "pipeline-smollm2.yaml")
    short = smollm2.model_copy(
        update={
            "games_per_iteration": 32,
            "game_init": smollm2.game_init.model_copy(update={"num_val": 32}),
        }
    )
    assert estimate_seconds(short, 133e9) == pytest.approx(27 * 60 + 33, rel=0.15)


def test_progress_echoes_progress_lines_with_elapsed_and_estimated_time():
    log, echo = io.StringIO(), io.StringIO()
    out = _Progress(log, echo, verbose=False, t0=0.0, estimate=605.0)
    out.write("noise\n[sparring] iteration 0: rollout reward 0.412\npartial")
    assert log.getvalue().endswith("partial")  # everything reaches the log
    (line,) = echo.getvalue().splitlines()
    clock, text = line.split("] ", 1)
    assert clock.endswith(" / ~10:05") and text == "[sparring] iteration 0: rollout reward 0.412"
