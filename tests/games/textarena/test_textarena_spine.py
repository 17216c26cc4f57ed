"""The TextArena games through the spine with the tiny model: the CLI (game-init, rollout,
train, evaluate) for each game, and the pipeline's tasks for Kuhn Poker with SPIRAL's
role-conditioned advantage (`train: {group_key: role, norm_adv_by_std: true}`)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

pytest.importorskip("textarena")

from sparring.cli import main  # noqa: E402
from sparring.loop import tasks  # noqa: E402
from sparring.loop.config import PipelineConfig  # noqa: E402
from sparring.tracking import PipelineRun  # noqa: E402

CONFIG = Path(__file__).with_name("kuhn-poker.yaml")
GAMES = {
    "kuhn-poker": ["--param", "max_rounds=1"],
    "tic-tac-toe": [],
    "simple-negotiation": ["--param", "max_turns=2"],
}


def run(*args: str) -> str:
    res = CliRunner().invoke(main, list(args), catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return res.output


@pytest.mark.parametrize("name", GAMES)
def test_cli_plays_rolls_out_trains_and_evaluates(name, tiny_model_dir, tmp_path):
    """Scripted-vs-random games give GRPO a per-role signal; the trained model then plays
    self-play rollouts and is evaluated against the game's scripted baseline."""
    game = ["--game", name, *GAMES[name]]
    run("game-init", *game, "--train", "4", "--val", "1", "--out", str(tmp_path / "inits"))
    train_inits, val_inits = tmp_path / "inits/train.parquet", tmp_path / "inits/val.parquet"
    for seats in ("scripted,random", "random,scripted"):  # each role both wins and loses
        run(
            "rollout",
            *game,
            "--inits",
            str(train_inits),
            "--seats",
            ",".join(f"{name}-{agent}" for agent in seats.split(",")),
            "--tokenizer",
            str(tiny_model_dir),
            "--games-per-init",
            "1",
            "--out",
            str(tmp_path / seats),
        )
    scripted = [
        str(tmp_path / s / "samples.parquet") for s in ("scripted,random", "random,scripted")
    ]
    df = pd.concat([pd.read_parquet(p) for p in scripted])
    assert set(df.role) == {"player_0", "player_1"} and df.reward.between(0, 1).all()
    train_cfg = tmp_path / "train.yaml"  # SPIRAL's role baseline, on every seat's rows
    train_cfg.write_text("group_key: role\nnorm_adv_by_std: true\npolicy: null\n")
    run(
        "train",
        "--config",
        str(train_cfg),
        "--model",
        str(tiny_model_dir),
        "--samples",
        scripted[0],
        "--samples",
        scripted[1],
        "--mini-batch-size",
        "16",
        "--micro-batch-size",
        "16",
        "--device",
        "cpu",
        "--out",
        str(tmp_path / "m1"),
    )
    trained = json.loads((tmp_path / "m1/metrics.json").read_text())
    assert trained["train/role/num_groups"] == 2
    common = [*game, "--max-new-tokens", "6", "--device", "cpu"]
    model = ["--model", str(tmp_path / "m1")]
    run("rollout", *model, *common, "--inits", str(train_inits), "--out", str(tmp_path / "ro"))
    stats = json.loads((tmp_path / "ro/stats.json").read_text())
    assert stats["rollout/games"] == 8 and 0 <= stats["rollout/normalized_reward"] <= 1
    assert {"rollout/win_rate", "rollout/draw_rate", "rollout/forfeit_rate"} <= set(stats)
    run("evaluate", *model, *common, "--inits", str(val_inits), "--out", str(tmp_path / "ev"))
    metrics = json.loads((tmp_path / "ev/metrics.json").read_text())
    for role in ("player_0", "player_1"):
        assert 0 <= metrics[f"eval/vs_scripted/{role}/normalized_reward"] <= 1


def test_pipeline_tasks_train_kuhn_poker_with_the_role_baseline(
    tiny_model_dir, tmp_path, mlflow_db
):
    """The shipped Kuhn Poker config at a tiny size: game-init, warm start on scripted play,
    a self-play rollout, GRPO on the `role` key with std normalisation, evaluation, register."""
    cfg = PipelineConfig.from_yaml(CONFIG)
    assert (cfg.group_key, cfg.train.norm_adv_by_std) == ("role", True)
    cfg = PipelineConfig.model_validate(
        cfg.model_dump(exclude_unset=True)
        | {
            "games_per_iteration": 8,
            "game_init": {"num_train": 4, "num_val": 2},
            "warm_start": {"num_states": 4, "train": {"mini_batch_size": 8}},
            "storage": {"root": (tmp_path / "store").as_uri()},
            "tracking": {"tracking_uri": mlflow_db},
        }
    )
    inits = tasks.game_init(cfg, tmp_path / "inits", "r")
    warm = tasks.warm_start(cfg, str(tiny_model_dir), str(inits["train"]), tmp_path / "m0")
    assert warm["train/samples"] == 8 and warm["warm_start/teacher_reward"] == 0.5  # zero-sum
    stats = tasks.rollout(
        cfg, str(tmp_path / "m0"), str(inits["train"]), 0, 8, tmp_path / "ro", "r"
    )
    assert stats["rollout/games"] == 8
    samples = pd.read_parquet(tmp_path / "ro/samples.parquet")
    # player_1 opens the hand; player_0 has no sample when player_1 forfeits before it speaks
    assert "player_1" in set(samples.role) <= {"player_0", "player_1"}
    metrics = tasks.train(
        cfg, str(tmp_path / "m0"), str(tmp_path / "ro/samples.parquet"), tmp_path / "m1"
    )
    # the role baseline: no signal exactly when every role's rewards are all equal
    flat = samples.groupby("role").reward.std(ddof=0).eq(0).all()
    assert metrics["train/no_signal"] == float(flat)
    if not flat:
        assert metrics["train/role/num_groups"] == samples.role.nunique()
    ev, _ = tasks.evaluate(
        cfg, str(tmp_path / "m1"), None, str(inits["val"]), tmp_path / "ev", "r", 0
    )
    assert {"eval/vs_scripted/player_1/normalized_reward", cfg.champion_metric} <= set(ev)
    parent = PipelineRun.start(cfg.tracking, "r").run_id
    done = tasks.register(cfg, parent, "r", 0, str(tmp_path / "m1"), stats | metrics | ev)
    assert done.version == "1"
