"""KFP component: GRPO training on one rollout (see sparring.steps.train)."""

from kfp.dsl import Dataset, Input, Metrics, Model, Output


def train(
    config: str,
    model: Input[Model],
    reference: Input[Model],
    samples: Input[Dataset],
    group_key: str,
    trained: Output[Model],
    metrics: Output[Metrics],
):
    """One GRPO update of `model` on the rollout's samples.

    Args:
        config: the PipelineConfig as JSON (its `train` section).
        model: the checkpoint that played the rollout.
        reference: the reference policy for the KL term (the first checkpoint).
        samples: the rollout folder (samples.parquet).
        group_key: GRPO group key (game, init, role, country, country_phase, batch).
        trained: the new checkpoint.
        metrics: train/* and perf/* statistics.
    """
    from sparring import steps
    from sparring.pipeline_config import PipelineConfig

    cfg = PipelineConfig.model_validate_json(config)
    stats = steps.train(
        cfg, model.path, f"{samples.path}/samples.parquet", trained.path, group_key, reference.path
    )
    for name, value in stats.items():
        metrics.log_metric(name, value)
