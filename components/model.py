"""KFP components that produce a checkpoint outside the iterations: the first one (see
sparring.tasks.initial_model and sparring.tasks.warm_start) and the iterates distilled after
the last (sparring.tasks.average); their output is a reference to it
(sparring.loop.checkpoints)."""

from kfp.dsl import Dataset, Input, Metrics, Model, Output


def initial_model(config: str, model: Output[Model]):
    """Materialize config.model: "tiny", a hub name, a path, s3://… or models:/name@alias.

    Args:
        config: the PipelineConfig as JSON.
        model: a reference to the checkpoint, stored under <storage.root>/models/<digest>.
    """
    from sparring.loop import checkpoints, tasks
    from sparring.loop.config import PipelineConfig

    cfg = PipelineConfig.model_validate_json(config)
    with checkpoints.produce(cfg, None, model.path) as out:
        tasks.initial_model(cfg, out)


def warm_start(
    config: str,
    base: Input[Model],
    inits: Input[Dataset],
    model: Output[Model],
    metrics: Output[Metrics],
):
    """SFT the base model on scripted self-play (config.warm_start).

    Args:
        config: the PipelineConfig as JSON.
        base: the initial checkpoint.
        inits: game-init folder; its train states are played.
        model: a reference to the warm-started checkpoint (under <storage.root>/models).
        metrics: SFT statistics.
    """
    from sparring.loop import checkpoints, tasks
    from sparring.loop.config import PipelineConfig

    cfg = PipelineConfig.model_validate_json(config).for_step("warm-start")
    train_inits = f"{inits.path}/train.parquet"
    with checkpoints.local(base.path, cfg) as base_dir:
        with checkpoints.produce(cfg, None, model.path) as out:
            stats = tasks.warm_start(cfg, base_dir, train_inits, out)
    for name, value in stats.items():
        metrics.log_metric(name, value)


def average(
    config: str,
    last: Input[Model],
    run_name: str,
    model: Output[Model],
    metrics: Output[Metrics],
):
    """Distill the run's iterates into one model (config.average): the last iterate fine-tuned
    on every iteration's stored rollout samples, or (`source: tables`) on the mixture of the
    tables its stored evaluations read out.

    Args:
        config: the PipelineConfig as JSON.
        last: the last iteration's trained checkpoint.
        run_name: from `start`; the samples are read from <storage.root>/<run_name>/<i>/rollout
            (the tables from <i>/eval).
        model: a reference to the distilled checkpoint (under <storage.root>/models).
        metrics: SFT statistics.
    """
    from sparring.loop import checkpoints, tasks
    from sparring.loop.config import PipelineConfig

    cfg = PipelineConfig.model_validate_json(config).for_step("train")
    with checkpoints.local(last.path, cfg) as last_dir:
        with checkpoints.produce(cfg, None, model.path) as out:
            stats = tasks.average(cfg, last_dir, run_name, out)
    for name, value in stats.items():
        metrics.log_metric(name, value)
