"""KFP components: GRPO training on one rollout (see sparring.tasks.train), or one whole
iteration on verl (see sparring.tasks.train_verl)."""

from kfp.dsl import Artifact, Dataset, Input, Metrics, Model, Output


def train(
    config: str,
    model: Input[Model],
    reference: Input[Model],
    samples: Input[Dataset],
    parent_run_id: str,
    iteration: int,
    run_name: str,
    trained: Output[Model],
    metrics: Output[Metrics],
    optimizer: Output[Artifact],
    previous_optimizer: Input[Artifact] = None,
):
    """One GRPO update of `model` on the rollout's samples.

    Args:
        config: the PipelineConfig as JSON (its `train` section).
        model: the checkpoint that played the rollout.
        reference: the KL term's reference (the magnet): the starting checkpoint, or with
            `magnet_every` the newest trained one it moved to.
        samples: the rollout folder (samples.parquet).
        parent_run_id: the MLflow parent run, from `start`; each optimizer step's train_step/*
            metrics go to the iteration's child run as it trains.
        iteration: the round.
        run_name: from `start`.
        trained: the new checkpoint.
        metrics: train/* and perf/* statistics.
        optimizer: AdamW's state after the update (train.optimizer_state: carry; else empty),
            never registered.
        previous_optimizer: the previous iteration's `optimizer` (carry; none for the first).
    """
    from pathlib import Path

    from sparring.loop import checkpoints, tasks
    from sparring.loop.config import PipelineConfig

    cfg = PipelineConfig.model_validate_json(config).for_step("train")
    samples_file = f"{samples.path}/samples.parquet"
    Path(optimizer.path).mkdir(parents=True, exist_ok=True)  # empty unless carried on
    carried = previous_optimizer.path if previous_optimizer else None
    kl = reference.path if cfg.train.kl_coef else None
    with checkpoints.local(model.path, cfg) as m, checkpoints.local(kl, cfg) as ref:
        with checkpoints.trained(cfg, run_name, iteration, trained.path) as out:
            stats = tasks.train(
                cfg, m, samples_file, out, ref, parent_run_id, iteration, carried, optimizer.path
            )
    for name, value in stats.items():
        metrics.log_metric(name, value)


def train_verl(
    config: str,
    model: Input[Model],
    inits: Input[Dataset],
    iteration: int,
    games: int,
    run_name: str,
    trained: Output[Model],
    data: Output[Dataset],
    metrics: Output[Metrics],
):
    """train_backend: verl. One iteration of online self-play GRPO inside verl (its main_ppo,
    on the GPUs of this pod), merged into a HF checkpoint; replaces rollout + train.

    Args:
        config: the PipelineConfig as JSON (its `verl` section).
        model: the current checkpoint (verl's actor, rollout and KL reference start from it).
        inits: game-init folder; the iteration's train states and every val state are played.
        iteration: the round; picks the train states.
        games: self-play games of the iteration (rows x verl.rollout_n).
        run_name: from `start`; the data folder goes to <storage.root>/<run_name>/<iteration>/verl.
        trained: the merged HF checkpoint.
        data: verl's dataset rows, agent-loop config, verl.log, merge.log and metrics.jsonl.
        metrics: verl/* (verl's last logged step) and perf/train_seconds.
    """
    from sparring.loop import checkpoints
    from sparring.loop.config import PipelineConfig
    from sparring.loop.verl_task import train_verl

    cfg = PipelineConfig.model_validate_json(config).for_step("train-verl")
    with checkpoints.local(model.path, cfg) as m:
        with checkpoints.trained(cfg, run_name, iteration, trained.path) as out:
            stats = train_verl(
                cfg, m, f"{inits.path}/train.parquet", f"{inits.path}/val.parquet",
                iteration, games, out, data.path, run_name=run_name,
            )  # fmt: skip
    for name, value in stats.items():
        metrics.log_metric(name, value)
