"""KFP component: batched self-play rollout (see sparring.steps.rollout)."""

from kfp.dsl import Dataset, Input, Metrics, Model, Output


def rollout(
    config: str,
    model: Input[Model],
    inits: Input[Dataset],
    iteration: int,
    games: int,
    run_name: str,
    samples: Output[Dataset],
    metrics: Output[Metrics],
):
    """Play `games` self-play games with the current model.

    Args:
        config: the PipelineConfig as JSON.
        model: the current checkpoint.
        inits: game-init folder; its train states are played.
        iteration: the round; picks the states and the sampling seed.
        games: games to play (a multiple of rollout.games_per_init).
        run_name: from `start`; the upload goes to <storage.root>/<run_name>/<iteration>/rollout.
        samples: folder with games.jsonl, samples.parquet and stats.json.
        metrics: rollout/* and perf/* statistics.
    """
    from sparring import steps
    from sparring.pipeline_config import PipelineConfig

    cfg = PipelineConfig.model_validate_json(config)
    train_inits = f"{inits.path}/train.parquet"
    stats = steps.rollout(cfg, model.path, train_inits, iteration, games, samples.path, run_name)
    for name, value in stats.items():
        metrics.log_metric(name, value)
