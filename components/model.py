"""KFP components that produce the first checkpoint (see sparring.tasks.initial_model and
sparring.tasks.warm_start)."""

from kfp.dsl import Dataset, Input, Metrics, Model, Output


def initial_model(config: str, model: Output[Model]):
    """Materialize config.model: "tiny", a hub name, a path, s3://… or models:/name@alias.

    Args:
        config: the PipelineConfig as JSON.
        model: the checkpoint folder.
    """
    from sparring.loop import tasks
    from sparring.loop.config import PipelineConfig

    tasks.initial_model(PipelineConfig.model_validate_json(config), model.path)


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
        model: the warm-started checkpoint.
        metrics: SFT statistics.
    """
    from sparring.loop import tasks
    from sparring.loop.config import PipelineConfig

    cfg = PipelineConfig.model_validate_json(config).for_step("warm-start")
    stats = tasks.warm_start(cfg, base.path, f"{inits.path}/train.parquet", model.path)
    for name, value in stats.items():
        metrics.log_metric(name, value)
