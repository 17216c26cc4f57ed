"""The verl task (`train_backend: verl`) on CPU: up to the launch (no GPU here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparring.pipeline import tasks
from sparring.pipeline.config import PipelineConfig
from sparring.tracking import connect
from sparring.verl_backend import task as verl_task


def registered(cfg: PipelineConfig) -> list:
    return connect(cfg.tracking).search_model_versions(f"name = '{cfg.registered_model}'")


# ---- train_backend: verl (CPU: up to the launch; no GPU here) -----------------------------
def verl_cfg(tmp_path) -> PipelineConfig:
    return PipelineConfig.model_validate(
        {
            "game": {"params": {"k": 3, "max_turns": 4}},
            "train_backend": "verl",
            "games_per_iteration": 16,
            "game_init": {"num_train": 6, "num_val": 2},
            "verl": {
                "n_gpus_per_node": 1,
                "rollout_n": 2,
                "train_batch_size": 8,
                "ppo_mini_batch_size": 8,
                "micro_batch_size_per_gpu": 1,
            },
            "storage": {"root": (tmp_path / "store").as_uri()},
            "tracking": {"tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}", "experiment": "v"},
            "registered_model": "verl-model",
        }
    )


def test_verl_launch_writes_the_rows_and_a_command_verls_hydra_config_accepts(
    tiny_model_dir, tmp_path
):
    import pandas as pd
    from hydra import compose, initialize_config_dir

    cfg = verl_cfg(tmp_path)
    inits = tasks.game_init(cfg, tmp_path / "inits", "r")
    cmd = verl_task.verl_launch(
        cfg,
        str(tiny_model_dir),
        str(inits["train"]),
        str(inits["val"]),
        1,
        16,
        tmp_path / "work",
        tmp_path / "scratch",
        python="python",
    )
    assert cmd[:3] == ["python", "-m", "verl.trainer.main_ppo"]
    train = pd.read_parquet(tmp_path / "work/data/train.parquet")
    val = pd.read_parquet(tmp_path / "work/data/val.parquet")
    # 16 games / (rollout_n 2 x 2 seats) = 4 states; iteration 1 rotates to states 4, 5, 0, 1.
    ids = pd.read_parquet(inits["train"]).init_id.tolist()
    assert len(train) == cfg.verl_rows_per_iteration == 8
    assert list(dict.fromkeys(e["init_id"] for e in train.extra_info)) == [
        ids[i] for i in (4, 5, 0, 1)
    ]
    assert len(val) == 2 * 2 and set(train.agent_name) == {"sparring_selfplay"}
    config_dir = Path(__import__("verl").__file__).parent / "trainer" / "config"
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        composed = compose(config_name="ppo_trainer", overrides=cmd[3:])
    assert composed.data.train_files == str(tmp_path / "work/data/train.parquet")
    assert composed.data.train_batch_size == 8 and composed.actor_rollout_ref.rollout.n == 2
    assert composed.actor_rollout_ref.model.path == str(tiny_model_dir)
    assert composed.trainer.default_local_dir == str(tmp_path / "scratch/ckpt")
    assert list(composed.trainer.logger) == ["console", "file"]
    loops = composed.actor_rollout_ref.rollout.agent.agent_loop_config_path
    assert Path(loops).read_text().startswith("- name: sparring_selfplay")
    with pytest.raises(ValueError, match="fewer rows than verl.train_batch_size"):
        verl_task.verl_launch(
            cfg,
            str(tiny_model_dir),
            str(inits["train"]),
            str(inits["val"]),
            0,
            8,
            tmp_path / "w2",
            tmp_path / "s2",
        )


def test_verl_launch_failure_raises_with_verls_output_and_registers_nothing(
    tiny_model_dir, tmp_path
):
    """The real `python -m verl.trainer.main_ppo` on this CPU-only machine: it exits non-zero
    (here before any GPU check: TransferQueue, from verl[verl-core], is not installed; the GPU
    image has it), and the step must say so with verl's own last lines."""
    cfg = verl_cfg(tmp_path)
    inits = tasks.game_init(cfg, tmp_path / "inits", "r")
    with pytest.raises(verl_task.VerlLaunchError) as err:
        verl_task.train_verl(
            cfg,
            str(tiny_model_dir),
            str(inits["train"]),
            str(inits["val"]),
            0,
            16,
            tmp_path / "model",
            tmp_path / "work",
            run_name="r",
        )
    message = str(err.value)
    assert "verl.trainer.main_ppo exited with code" in message
    assert "nothing was trained or registered" in message
    assert "Error" in message.splitlines()[-1]  # verl's last line names its exception
    assert str(tmp_path / "work/verl.log") in message
    tail = message.split("lines:\n", 1)[1].splitlines()
    log_lines = (tmp_path / "work/verl.log").read_text().splitlines()
    assert tail == log_lines[-len(tail) :]  # the tail is verl's own output, in order
    assert not (tmp_path / "model/config.json").exists()  # no merge ran
    assert not (tmp_path / "store/r/0").exists()  # neither data nor checkpoint uploaded
    assert registered(cfg) == []
