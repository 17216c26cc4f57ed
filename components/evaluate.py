"""KFP components: evaluation on val games, and once at the end on test games (see
sparring.loop.tasks.evaluate and evaluate_test)."""

from kfp.dsl import HTML, Artifact, Dataset, Input, Metrics, Model, Output


def evaluate(
    config: str,
    model: Input[Model],
    inits: Input[Dataset],
    iteration: int,
    run_name: str,
    evaluation: Output[Artifact],
    metrics: Output[Metrics],
    report: Output[HTML],
    previous: Input[Model] = None,
    parent_run_id: str = "",
    member: str = "",
):
    """Play val games in self-play, against `previous` and against the scripted baseline.

    Args:
        config: the PipelineConfig as JSON (its `eval` section).
        model: the new checkpoint.
        previous: the checkpoint before this iteration's training (none for the start).
        inits: game-init folder; its val states are played.
        iteration: the round.
        run_name: from `start`; the upload goes to <storage.root>/<run_name>/<iteration>/eval.
        parent_run_id: the MLflow parent run, for the start's evaluation only (no register
            step records it); empty otherwise.
        member: a name for a model beside the iteration's own (`average`): the upload goes
            to <iteration>/eval/<member>; empty for the iteration's model.
        evaluation: folder with metrics.json, scores.json, rewards.png and transcripts.json.
        metrics: eval/<mode>/<role>/* metrics.
        report: the reward plot and sample transcripts, viewable in the KFP UI.
    """
    from sparring.loop import checkpoints, tasks
    from sparring.loop.config import PipelineConfig

    cfg = PipelineConfig.model_validate_json(config).for_step("evaluate")
    val = f"{inits.path}/val.parquet"
    before = previous.path if previous else None
    with checkpoints.local(model.path, cfg) as m, checkpoints.local(before, cfg) as p:
        scores, page = tasks.evaluate(
            cfg, m, p, val, evaluation.path, run_name, iteration, parent_run_id or None,
            member or None,
        )  # fmt: skip
    for name, value in scores.items():
        metrics.log_metric(name, value)
    with open(report.path, "w") as f:
        f.write(page)


def evaluate_test(
    config: str,
    start: Input[Model],
    final: Input[Model],
    inits: Input[Dataset],
    run_name: str,
    parent_run_id: str,
    iteration: int,
    evaluation: Output[Artifact],
    metrics: Output[Metrics],
):
    """Score the start and the final model once on the test states; their paired gain.

    Args:
        config: the PipelineConfig as JSON (its `eval` section and champion metric).
        start: the model before any update (after the warm start).
        final: the last iteration's checkpoint.
        inits: game-init folder; its test states are played.
        run_name: from `start`; the upload goes to <storage.root>/<run_name>/test.
        parent_run_id: the MLflow parent run, which gets the test/* figures.
        iteration: the last iteration (the figures' step).
        evaluation: folder with test.json (the figures and every game's score).
        metrics: test/start, test/final, test/gain, test/gain_se.
    """
    from sparring.loop import checkpoints, tasks
    from sparring.loop.config import PipelineConfig

    cfg = PipelineConfig.model_validate_json(config).for_step("evaluate")
    test = f"{inits.path}/test.parquet"
    with checkpoints.local(start.path, cfg) as s, checkpoints.local(final.path, cfg) as f:
        figures = tasks.evaluate_test(
            cfg, s, f, test, evaluation.path, run_name, parent_run_id, iteration
        )
    for name, value in figures.items():
        metrics.log_metric(name, value)
