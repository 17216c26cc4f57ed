"""`sparring train` / `sparring sft` and their shipped configs."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from sample_frames import make_samples
from transformers import AutoTokenizer

from sparring.cli import main
from sparring.train_config import GRPOConfig

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


@pytest.mark.parametrize("name", ["train.yaml", "sft.yaml"])
def test_shipped_configs_validate(name):
    text = (CONFIGS / name).read_text()
    assert text.startswith("#") and f"--config configs/{name}" in text  # header with the command
    GRPOConfig.model_validate(yaml.safe_load(text))


@pytest.fixture
def samples(tiny_model_dir, tmp_path):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    path = tmp_path / "samples.parquet"
    make_samples(tokenizer, [1.0, 1.0, 0.0, 0.0]).to_parquet(path)
    return str(path)


def test_train_cli_errors_are_one_clear_line(tiny_model_dir, samples, tmp_path):
    args = [
        "train",
        "--config",
        str(CONFIGS / "train.yaml"),
        "--model",
        str(tiny_model_dir),
        "--samples",
        samples,
        "--out",
        str(tmp_path / "out"),
    ]
    result = CliRunner().invoke(main, [*args, "--group-key", "game"])  # both seats tie per game
    assert result.exit_code == 1 and "Error: all 4 samples have zero advantage" in result.output
    result = CliRunner().invoke(main, [*args, "--micro-batch-size", "64"])
    assert result.exit_code == 2 and "lower micro_batch_size" in result.output


def test_sft_cli_writes_a_checkpoint(tiny_model_dir, samples, tmp_path):
    result = CliRunner().invoke(
        main,
        [
            "sft",
            "--config",
            str(CONFIGS / "sft.yaml"),
            "--model",
            str(tiny_model_dir),
            "--samples",
            samples,
            "--out",
            str(tmp_path / "sft"),
            "--epochs",
            "1",
        ],
    )
    assert result.exit_code == 0, result.output
    assert (tmp_path / "sft" / "model.safetensors").exists() and "train/loss" in result.output
