"""KFP components that open and close a pipeline run (see sparring.tasks.start / finish)."""

from kfp.dsl import Markdown, Output, OutputPath, PipelineTaskFinalStatus


def start(config: str, job_name: str, run_name: OutputPath(str), parent_run_id: OutputPath(str)):
    """Check S3 and MLflow, store the config, open the MLflow parent run.

    Args:
        config: the PipelineConfig as JSON.
        job_name: the KFP job name (used as the run name unless the config sets one).
        run_name: the run's folder under storage.root and its MLflow run name.
        parent_run_id: the MLflow parent run that the iterations log under.
    """
    from sparring.pipeline import tasks
    from sparring.pipeline.config import PipelineConfig

    name, run_id = tasks.start(PipelineConfig.model_validate_json(config), job_name)
    for path, value in ((run_name, name), (parent_run_id, run_id)):
        with open(path, "w") as f:
            f.write(value)


def finish(config: str, job_name: str, status: PipelineTaskFinalStatus, summary: Output[Markdown]):
    """The pipeline's exit handler: end the MLflow parent run (FAILED if any task failed) and
    write the reward-per-iteration table.

    Args:
        config: the PipelineConfig as JSON.
        job_name: the KFP job name (the run name unless the config sets one, as in `start`).
        status: the pipeline's final status, filled in by KFP.
        summary: a Markdown table of every iteration and the champion.
    """
    from sparring.pipeline import tasks
    from sparring.pipeline.config import PipelineConfig

    cfg = PipelineConfig.model_validate_json(config)
    text = tasks.finish(cfg, job_name, failed=status.state != "SUCCEEDED")
    with open(summary.path, "w") as f:
        f.write(text)
    print(text)
