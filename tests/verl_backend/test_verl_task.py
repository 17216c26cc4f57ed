"""The verl task (`train_backend: verl`) on CPU: up to the launch (no GPU here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparring.loop import tasks, verl_task
from sparring.loop.config import PipelineConfig
from sparring.tracking import connect


def registered(cfg: PipelineConfig) -> list:
    return connect(cfg.tracking).search_model_versions(f"name = '{cfg.registered_model}'")


# ---- train_backend: verl (CPU: up to the launch; no GPU here) -----------------------------
# main_ppo's Ray cluster on a small machine: one TransferQueue storage actor, no dashboard.
SMALL_RAY = (
    "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
    "+ray_kwargs.ray_init.include_dashboard=False",
)


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


@pytest.mark.usefixtures("mlflow_db")  # at tmp_path / "mlflow.db": verl_cfg's store
def test_main_ppo_gets_to_the_gpu_check_and_the_task_fails_with_its_last_lines(
    tiny_model_dir, tmp_path
):
    """The real `python -m verl.trainer.main_ppo` with Sparring's composed config on this
    CPU-only machine: hydra composes it, the V1 trainer imports (TransferQueue, the
    `verl-core` extra, is installed with the dev extra as in the GPU image), TransferQueue
    starts, the tokenizer and both datasets load (8 train rows, 4 val rows), and verl stops
    where it needs a GPU: its resource check. The task raises VerlLaunchError with verl's last
    lines, and nothing is merged, uploaded or registered. `verl.ray_num_cpus` gives Ray 16
    logical CPUs: on 2 cores TransferQueue's storage actors would wait forever for one. Sized
    for 2 cores (`overrides`): one storage actor instead of verl's 8 (each a Ray worker that
    imports torch: 40 s of the run) and no Ray dashboard."""
    import sys

    cfg = verl_cfg(tmp_path)
    cfg.verl.ray_num_cpus = 16
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
            python=sys.executable,
            overrides=SMALL_RAY,
        )
    log = (tmp_path / "work/verl.log").read_text()
    config = log.find("'agent_loop_config_path': '" + str(tmp_path / "work/agent_loops.yaml"))
    datasets = [  # printed by two processes through Ray: their order is not fixed
        log.find(marker)
        for marker in (
            "dataset len: 8",
            "dataset len: 4",
            "train and validate dataloader initialized, train dataset size: 8, val dataset size: 4",
        )
    ]
    gpu_check = "ValueError: Total available GPUs 0 is less than total desired GPUs 1"
    assert -1 < log.find("TaskRunnerV1") < config < min(datasets)  # configured, then imported
    assert "'num_data_storage_units': 1," in log  # the overrides reached verl's config
    assert -1 not in datasets and max(datasets) < log.find(gpu_check)  # loaded, then the GPU
    message = str(err.value)
    assert "verl.trainer.main_ppo exited with code" in message
    assert message.splitlines()[-1].endswith(gpu_check)  # verl's own last line
    tail = message.split("lines:\n", 1)[1].splitlines()
    assert tail == log.splitlines()[-len(tail) :]  # the tail is verl's output, in order
    assert not (tmp_path / "model/config.json").exists()  # no merge ran
    assert not (tmp_path / "store/r/0").exists()  # neither data nor checkpoint uploaded
    assert registered(cfg) == []
