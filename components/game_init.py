"""KFP component: seeded initial game states (see sparring.tasks.game_init)."""

from kfp.dsl import Dataset, Output


def game_init(config: str, run_name: str, inits: Output[Dataset]):
    """Write train.parquet and val.parquet (config.game_init) and upload them.

    Args:
        config: the PipelineConfig as JSON.
        run_name: from `start`; the upload goes to <storage.root>/<run_name>/inits.
        inits: a folder with train.parquet and val.parquet.
    """
    from sparring.loop import tasks
    from sparring.loop.config import PipelineConfig

    tasks.game_init(PipelineConfig.model_validate_json(config), inits.path, run_name)
