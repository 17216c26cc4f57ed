"""Every YAML config the project ships validates against the config class it is written for."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from sparring.pipeline.config import CONFIG_DIR, PipelineConfig
from sparring.sft import SFTConfig
from sparring.train import GRPOConfig

SHIPPED = sorted(CONFIG_DIR.rglob("*.yaml"))
CLASSES = {"train.yaml": GRPOConfig, "sft.yaml": SFTConfig}  # any other file: a pipeline


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(CONFIG_DIR)))
def test_shipped_config_validates(path: Path):
    cls = CLASSES.get(path.name, PipelineConfig)
    data = yaml.safe_load(path.read_text())
    cfg = cls.model_validate(data)
    if cls is PipelineConfig:  # its train sections are dicts: validate them as their trainers do
        cfg.grpo_config(), cfg.sft_config()


def test_every_config_opens_with_a_comment_block():
    for path in SHIPPED:
        assert path.read_text().startswith("#"), f"{path} has no header comment"


def test_a_broken_config_names_the_bad_field():
    data = yaml.safe_load((CONFIG_DIR / "pipeline.yaml").read_text())
    data["rollout"]["games_per_init"] = 0
    with pytest.raises(ValueError, match="rollout.games_per_init"):
        PipelineConfig.model_validate(data)
