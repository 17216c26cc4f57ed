"""KFP components that open and close a pipeline run (see sparring.tasks.start / finish)."""

from typing import NamedTuple

from kfp.dsl import Markdown, Output, OutputPath, PipelineTaskFinalStatus


def start(
    config: str,
    compiled: str,
    job_id: str,
    job_name: str,
    model: str,
    learning_rate: float,
    init_seed: int,
    sampling_seed: int,
    games_per_iteration: int,
    eval_games: int,
    experiment: str,
    registered_model: str,
    run_config: OutputPath(str),
    run_name: OutputPath(str),
    parent_run_id: OutputPath(str),
):
    """Resolve the run's config, check S3 and MLflow, store the config, open the MLflow parent
    run (once per KFP run).

    Args:
        config: the PipelineConfig as JSON (the `config` run parameter).
        compiled: the compile-time fingerprint and parameter defaults (run_params.compile_time).
        job_id: the KFP run's unique id (the storage key unless the config sets campaign).
        job_name: the KFP run's display name (the MLflow run's name; not unique).
        model, learning_rate, init_seed, sampling_seed, games_per_iteration, eval_games,
            experiment, registered_model: the run parameters (sparring.loop.run_params).
        run_config: the resolved config as JSON, which every later task reads.
        run_name: the run's folder under storage.root (the campaign id, else job_id).
        parent_run_id: the MLflow parent run that the iterations log under.
    """
    from sparring.loop import run_params, tasks

    params = {
        "model": model,
        "learning_rate": learning_rate,
        "init_seed": init_seed,
        "sampling_seed": sampling_seed,
        "games_per_iteration": games_per_iteration,
        "eval_games": eval_games,
        "experiment": experiment,
        "registered_model": registered_model,
    }
    cfg = run_params.resolve(config, params, compiled)
    name, run_id = tasks.start(cfg, job_id, job_name)
    for path, value in (
        (run_config, cfg.model_dump_json()),
        (run_name, name),
        (parent_run_id, run_id),
    ):
        with open(path, "w") as f:
            f.write(value)


def finish(
    config: str,
    compiled: str,
    job_id: str,
    job_name: str,
    experiment: str,
    registered_model: str,
    status: PipelineTaskFinalStatus,
    summary: Output[Markdown],
) -> NamedTuple("Outputs", [("champion_version", str), ("champion_score", float)]):
    """The pipeline's exit handler: end the MLflow parent run (FAILED unless every task
    succeeded), write the reward-per-iteration table and return the champion (the pipeline's
    outputs).

    Args:
        config, compiled, job_id, job_name, experiment, registered_model: as in `start`.
        status: the pipeline's final status, filled in by KFP (COMPLETE on the backend).
        summary: a Markdown table of every iteration and the champion, linking to MLflow.

    Returns:
        The champion's version and score ("" and nan when there is none).
    """
    from collections import namedtuple

    from sparring.loop import run_params, tasks

    params = {"experiment": experiment, "registered_model": registered_model}
    try:
        cfg = run_params.resolve(config, params, compiled)
    except ValueError as e:  # `start` failed on it too: nothing was opened
        text = f"## {job_name}: FAILED\n\nthe run's config was rejected:\n\n    {e}\n"
        champion = ("", float("nan"))
    else:
        failed = status.state not in tasks.SUCCESS_STATES
        text = tasks.finish(cfg, job_id, job_name, failed=failed)
        champion = tasks.champion_of(cfg)
    with open(summary.path, "w") as f:
        f.write(text)
    print(text)
    return namedtuple("Outputs", ["champion_version", "champion_score"])(*champion)
