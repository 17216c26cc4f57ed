"""KFP component: evaluation on val games (see sparring.tasks.evaluate)."""

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
):
    """Play val games in self-play, against `previous` and against the scripted baseline.

    Args:
        config: the PipelineConfig as JSON (its `eval` section).
        model: the new checkpoint.
        previous: the checkpoint before this iteration's training (none for the start).
        inits: game-init folder; its val states are played.
        iteration: the round.
        run_name: from `start`; the upload goes to <storage.root>/<run_name>/<iteration>/eval.
        evaluation: folder with metrics.json, rewards.png and transcripts.json.
        metrics: eval/<mode>/<role>/* metrics.
        report: the reward plot and sample transcripts, viewable in the KFP UI.
    """
    from sparring.loop import tasks
    from sparring.loop.config import PipelineConfig

    cfg = PipelineConfig.model_validate_json(config).for_step("evaluate")
    val = f"{inits.path}/val.parquet"
    scores, page = tasks.evaluate(
        cfg,
        model.path,
        previous.path if previous else None,
        val,
        evaluation.path,
        run_name,
        iteration,
    )
    for name, value in scores.items():
        metrics.log_metric(name, value)
    with open(report.path, "w") as f:
        f.write(page)
