"""KFP component: batched self-play rollout (see sparring.tasks.rollout)."""

from kfp.dsl import Artifact, Dataset, Input, Metrics, Model, Output


def rollout(
    config: str,
    model: Input[Model],
    inits: Input[Dataset],
    iteration: int,
    games: int,
    run_name: str,
    samples: Output[Dataset],
    metrics: Output[Metrics],
    schedule: Output[Artifact],
    previous_schedule: Input[Artifact] = None,
):
    """Play `games` games with the current model: self-play, or the opponent mix.

    Args:
        config: the PipelineConfig as JSON.
        model: the current checkpoint.
        inits: game-init folder; its train states are played.
        iteration: the round; picks the states and the sampling seed.
        games: games to play (a multiple of rollout.games_per_init).
        run_name: from `start`; the upload goes to <storage.root>/<run_name>/<iteration>/rollout.
            `past-<k>` opponents load from <storage.root>/<run_name>/<iteration-k-1>/checkpoint
            (or /initial, which the rollout of iteration 0 stores).
        samples: folder with games.jsonl, samples.parquet and stats.json (with the opponent
            mix also schedule.json and seat_plan.jsonl, whose `opponent_model` names the
            checkpoint a `past-<k>` opponent resolved to).
        metrics: rollout/* and perf/* statistics (with the opponent mix also difficulty/*).
        schedule: the difficulty schedule after this rollout (schedule.json), `{}` after pure
            self-play; the next iteration's `previous_schedule`.
        previous_schedule: the previous rollout's `schedule`; none in the first iteration.
    """
    import os
    import shutil

    from sparring.loop import checkpoints, tasks
    from sparring.loop.config import PipelineConfig

    cfg = PipelineConfig.model_validate_json(config).for_step("rollout")
    train_inits = f"{inits.path}/train.parquet"
    previous = previous_schedule.path if previous_schedule else None
    with checkpoints.local(model.path, cfg) as m:
        stats = tasks.rollout(
            cfg, m, train_inits, iteration, games, samples.path, run_name, previous
        )
    saved = f"{samples.path}/schedule.json"
    if os.path.exists(saved):
        shutil.copyfile(saved, schedule.path)
    else:
        with open(schedule.path, "w") as f:
            f.write("{}")
    for name, value in stats.items():
        metrics.log_metric(name, value)
