"""KFP components that produce the first checkpoint (see sparring.tasks.initial_model and
sparring.tasks.warm_start); their output is a reference to it (sparring.loop.checkpoints)."""

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
