"""Diplomacy from the command line with the tiny model: game-init, rollout, and the evaluator
(policy vs every scripted bot in every country: metrics, table and heat map)."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from click.testing import CliRunner

pytest.importorskip("diplomacy")

from sparring.cli import main  # noqa: E402
from sparring.games.diplomacy import ROLES  # noqa: E402
from sparring.games.diplomacy.report import country_grid  # noqa: E402

PARAMS = ("--param", "horizon=1", "--param", "press=false")


def run(*args: str) -> str:
    res = CliRunner().invoke(main, list(args), catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return res.output


@pytest.fixture(scope="module")
def inits(tmp_path_factory):
    out = tmp_path_factory.mktemp("dip-inits")
    run(
        "game-init", "--game", "diplomacy", *PARAMS, "--train", "2", "--val", "1", "--out", str(out)
    )
    return out


def test_rollout_command(inits, tmp_path, tiny_model_dir):
    run(
        "rollout",
        "--game",
        "diplomacy",
        *PARAMS,
        "--model",
        str(tiny_model_dir),
        "--inits",
        str(inits / "train.parquet"),
        "--games-per-init",
        "1",
        "--max-new-tokens",
        "8",
        "--out",
        str(tmp_path),
    )
    df = pd.read_parquet(tmp_path / "samples.parquet")
    # one row per (game, power that still had units): 2 games x up to 7 powers
    assert 7 <= len(df) <= 14 and (df.country == df.role).all()
    assert all(p.startswith(f"{c}/") for c, p in zip(df.country, df.country_stage, strict=True))


def test_evaluate_against_every_bot_in_every_country(inits, tmp_path, tiny_model_dir):
    run(
        "evaluate",
        "--game",
        "diplomacy",
        *PARAMS,
        "--model",
        str(tiny_model_dir),
        "--inits",
        str(inits / "val.parquet"),
        "--modes",
        "selfplay,vs_scripted",
        "--max-new-tokens",
        "8",
        "--out",
        str(tmp_path),
    )
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    grid = country_grid(metrics)
    # vs_scripted is the default opponent (greedy); the other bots are modes of their own
    assert list(grid) == ["vs_hold", "vs_random-legal", "vs_support", "vs_scripted", "selfplay"]
    assert all(set(row) == set(ROLES) for row in grid.values())
    for mode in ("vs_hold", "vs_random-legal", "vs_support", "vs_scripted"):
        assert metrics[f"eval/{mode}/FRANCE/games"] == 1.0
        assert 0.0 <= metrics[f"eval/{mode}/all/normalized_reward"] <= 1.0
        assert {f"eval/{mode}/{r}/invalid_rate" for r in ROLES} <= set(metrics)
        assert f"eval/{mode}/FRANCE/centers" in metrics  # the game's own per-power metrics
    assert "eval/selfplay/TURKEY/normalized_reward" in metrics
    # the bots as baselines: each in the learner's country against greedy, on the same state
    trivial = [metrics[f"eval/baseline/{b}"] for b in ("hold", "random-legal")]
    assert 0.0 < metrics["eval/baseline/greedy"] <= 1.0
    assert 0.0 < metrics["eval/baseline/support"] <= 1.0
    model = metrics["eval/vs_scripted/all/normalized_reward"]  # one state: no pairing to do
    assert metrics["eval/gain_over_best_trivial"] == pytest.approx(model - max(trivial))
    games = json.loads((tmp_path / "rewards.json").read_text())["vs_scripted"]
    assert {g["game_id"].split("#")[0].split("/", 1)[1] for g in games} == {
        f"vs_scripted/greedy/{r}" for r in ROLES
    }
    table = (tmp_path / "country_table.md").read_text()
    assert all(f"| {c} |" in table for c in ROLES) and "vs_random-legal" in table
    assert (tmp_path / "country_heatmap.png").read_bytes()[:4] == b"\x89PNG"
