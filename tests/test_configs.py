"""Every YAML config the project ships validates against the config class it is written for."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from sparring.loop.config import CONFIG_DIR, PipelineConfig
from sparring.sft import SFTConfig
from sparring.train import GRPOConfig

ROOT = Path(__file__).resolve().parents[1]
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


def test_the_real_model_pipeline_starts_from_the_cached_conversion(
    smollm2_dir, tmp_path, monkeypatch
):
    """Its initial-model task resolves the name offline from the model cache."""
    from sparring.loop.tasks import initial_model
    from sparring.model_zoo import CACHE_ENV

    monkeypatch.setenv(CACHE_ENV, str(smollm2_dir.parents[1]))  # <cache>/named/<model>
    cfg = PipelineConfig.model_validate(
        yaml.safe_load((CONFIG_DIR / "pipeline-smollm2.yaml").read_text())
    )
    out = initial_model(cfg, tmp_path / "model")
    assert (out / "model.safetensors").stat().st_size == (
        smollm2_dir / "model.safetensors"
    ).stat().st_size
    assert not (out / ".complete").exists()  # the cache's marker stays in the cache
