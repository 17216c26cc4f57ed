"""The `sparring` command line, run as a user would (click's runner, real files)."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from click.testing import CliRunner

from sparring.cli import COMMANDS, main


def run(*args: str) -> str:
    res = CliRunner().invoke(main, list(args), catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return res.output


def test_every_command_has_help():
    out = run("--help")
    for name in COMMANDS:
        cmd = name.replace("_", "-")
        assert cmd in out
        assert "Usage" in run(cmd, "--help")


def test_game_init_is_seeded(tmp_path):
    for d in ("a", "b", "c"):
        seed = "1" if d == "c" else "0"
        run(
            "game-init",
            "--param",
            "k=3",
            "--train",
            "5",
            "--val",
            "3",
            "--seed",
            seed,
            "--out",
            str(tmp_path / d),
        )
    a, b, c = (pd.read_parquet(tmp_path / d / "train.parquet") for d in "abc")
    assert a.equals(b) and not a.state.equals(c.state)
    val = pd.read_parquet(tmp_path / "a" / "val.parquet")
    assert len(a) == 5 and len(val) == 3 and set(val.split) == {"val"}
    assert json.loads(a.state[0])["k"] == 3
    # growing the train split leaves the val games unchanged
    run("game-init", "--param", "k=3", "--train", "9", "--val", "3", "--out", str(tmp_path / "d"))
    assert pd.read_parquet(tmp_path / "d" / "val.parquet").equals(val)


def test_rollout_and_evaluate_commands(tmp_path, tiny_model_dir):
    run(
        "game-init",
        "--param",
        "k=3",
        "--train",
        "2",
        "--val",
        "2",
        "--out",
        str(tmp_path / "inits"),
    )
    common = [
        "--param",
        "k=3",
        "--param",
        "max_turns=2",
        "--max-new-tokens",
        "8",
        "--device",
        "cpu",
    ]
    run(
        "rollout",
        "--model",
        str(tiny_model_dir),
        "--inits",
        str(tmp_path / "inits/train.parquet"),
        "--out",
        str(tmp_path / "ro"),
        "--games-per-init",
        "2",
        *common,
    )
    df = pd.read_parquet(tmp_path / "ro/samples.parquet")
    assert len(df) == 8 and (df.groupby("init").size() == 4).all()  # 2 plays x 2 seats
    run(
        "evaluate",
        "--model",
        str(tiny_model_dir),
        "--inits",
        str(tmp_path / "inits/val.parquet"),
        "--out",
        str(tmp_path / "ev"),
        "--modes",
        "selfplay,vs_scripted",
        *common,
    )
    metrics = json.loads((tmp_path / "ev/metrics.json").read_text())
    assert "eval/vs_scripted/player_a/normalized_reward" in metrics
    assert (tmp_path / "ev/rewards.png").stat().st_size > 1000


def test_scripted_rollout_writes_warm_start_samples(tmp_path, tiny_model_dir):
    run(
        "game-init",
        "--param",
        "k=3",
        "--train",
        "3",
        "--val",
        "0",
        "--out",
        str(tmp_path / "inits"),
    )
    run(
        "rollout",
        "--inits",
        str(tmp_path / "inits/train.parquet"),
        "--param",
        "k=3",
        "--seats",
        "matching-scripted,matching-scripted",
        "--tokenizer",
        str(tiny_model_dir),
        "--games-per-init",
        "1",
        "--out",
        str(tmp_path / "ro"),
    )
    df = pd.read_parquet(tmp_path / "ro/samples.parquet")
    assert len(df) == 6 and (df.reward > 0).all()


def test_bad_config_is_a_usage_error(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("num_train: -3\n")
    res = CliRunner().invoke(
        main, ["game-init", "--config", str(bad), "--out", str(tmp_path / "o")]
    )
    assert res.exit_code == 2 and "num_train" in res.output


@pytest.mark.parametrize("cmd", ["game-init", "rollout", "evaluate"])
def test_missing_required_option_fails_cleanly(cmd):
    res = CliRunner().invoke(main, [cmd])
    assert res.exit_code == 2 and "Missing option" in res.output


def test_an_override_of_null_clears_the_field_and_an_unset_option_does_not():
    """`--set warm_start=null` drops the config's warm start (it used to be ignored, so the arm
    warm-started a second time); None, an option left unset, keeps the file's value."""
    from sparring.cli.options import load_config, parse_params
    from sparring.loop.config import DEFAULT_CONFIG, PipelineConfig

    path = str(DEFAULT_CONFIG)
    cleared = load_config(PipelineConfig, path, parse_params(("warm_start=null", "model=/m")))
    assert cleared.warm_start is None and cleared.model == "/m"
    kept = load_config(PipelineConfig, path, {"warm_start": None, "iterations": None})
    assert kept.warm_start is not None and kept.iterations == 4
