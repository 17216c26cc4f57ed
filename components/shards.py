"""KFP components: one rollout shard, and the merge of all shards (see sparring.loop.shards)."""

from kfp.dsl import Dataset, Input, Metrics, Model, Output


def rollout_shard(
    config: str,
    model: Input[Model],
    inits: Input[Dataset],
    iteration: int,
    games: int,
    shard: int,
    samples: Output[Dataset],
):
    """Play one contiguous slice of the iteration's initial states (rollout.shards > 1).

    Args:
        config: the PipelineConfig as JSON.
        model: the current checkpoint.
        inits: game-init folder; its train states are played.
        iteration: the round; picks the states and the sampling seed.
        games: games of the whole iteration (all shards together).
        shard: this shard's index, 0 .. rollout.shards - 1.
        samples: folder with this shard's games.jsonl, samples.parquet and stats.json.
    """
    from sparring.loop import checkpoints
    from sparring.loop.config import PipelineConfig
    from sparring.loop.shards import play_shard

    cfg = PipelineConfig.model_validate_json(config)
    train_inits = f"{inits.path}/train.parquet"
    with checkpoints.local(model.path, cfg) as model_dir:
        play_shard(cfg, model_dir, train_inits, iteration, games, shard, samples.path)


def merge_rollouts(
    config: str,
    shards: Input[list[Dataset]],
    iteration: int,
    run_name: str,
    samples: Output[Dataset],
    metrics: Output[Metrics],
):
    """Merge the shards into the iteration's one rollout, uploaded like a single task's.

    Args:
        config: the PipelineConfig as JSON.
        shards: every shard's folder, in shard order.
        iteration: the round.
        run_name: from `start`; the upload goes to <storage.root>/<run_name>/<iteration>/rollout.
        samples: folder with the merged games.jsonl, samples.parquet and stats.json.
        metrics: rollout/* of the merged games and perf/* summed over the shards.
    """
    from sparring.loop.config import PipelineConfig
    from sparring.loop.shards import merge

    cfg = PipelineConfig.model_validate_json(config)
    stats = merge(cfg, [s.path for s in shards], samples.path, run_name, iteration)
    for name, value in stats.items():
        metrics.log_metric(name, value)
