"""KFP component: verify and register a checkpoint (see sparring.tasks.register)."""

from kfp.dsl import Artifact, Dataset, Input, Metrics, Model


def register(
    config: str,
    model: Input[Model],
    iteration: int,
    run_name: str,
    parent_run_id: str,
    evaluation: Input[Artifact],
    eval_metrics: Input[Metrics],
    kfp_run_id: str,
    samples: Input[Dataset] = None,
    rollout_metrics: Input[Metrics] = None,
    train_metrics: Input[Metrics] = None,
    member: str = "",
) -> str:
    """Verify the checkpoint at <storage.root>/<run_name>/<iteration>/checkpoint, log the
    iteration to MLflow and register it; `champion` moves only on improvement.

    Args:
        config: the PipelineConfig as JSON.
        model: the trained checkpoint.
        iteration: the round.
        run_name: from `start`.
        parent_run_id: the MLflow parent run, from `start`.
        samples: the rollout folder (games.jsonl is logged to MLflow), or with train_backend
            verl the verl-train data folder (logged whole: rows, verl.log, metrics.jsonl).
        evaluation: the evaluate folder (plot and transcripts are logged to MLflow).
        rollout_metrics, train_metrics, eval_metrics: logged to the iteration's child run
            (with train_backend verl the first two are both verl-train's metrics).
        kfp_run_id: the KFP run's unique id, a tag of the model version.
        member: a model beside the iteration's own (`average`, the distilled iterates),
            stored at <iteration>/members/<member>/checkpoint and registered under that
            alias in a child run of its own with its eval metrics (and its SFT's as
            train_metrics), off the parent run's curve, leaving the iteration's run as it was
            (no samples or rollout metrics given); empty for the iteration's model.

    Returns:
        The new model version.
    """
    import os

    from sparring.loop import tasks
    from sparring.loop.config import PipelineConfig
    from sparring.tracking import numeric

    # On a KFP backend, metadata also holds MLMD's string properties (display_name, …).
    metrics = {}
    for consumed in (rollout_metrics, train_metrics, eval_metrics):
        metrics |= numeric(consumed.metadata) if consumed else {}
    artifacts = []
    if samples:  # a rollout folder; verl-train's data folder has no games.jsonl
        games = f"{samples.path}/games.jsonl"
        artifacts = [games if os.path.exists(games) else samples.path, evaluation.path]
    cfg = PipelineConfig.model_validate_json(config)
    scores = tasks.load_scores(evaluation.path)  # the champion metric per val game
    done = tasks.register(
        cfg, parent_run_id, run_name, iteration, model.path, metrics, artifacts,
        kfp_run_id or None, scores, member or None, curve=not member,
    )  # fmt: skip
    return done.version
