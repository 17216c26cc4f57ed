"""configs/examples/: one pipeline config per backend, each opening with a comment block
(purpose, launch command, an override example) that holds, validates and compiles."""

from __future__ import annotations

import re

import pytest
import yaml
from sparring.pipelines.selfplay import compile_pipeline

from sparring.loop.config import CONFIG_DIR, PipelineConfig

EXAMPLES = CONFIG_DIR / "examples"
BACKENDS = {  # file -> what it must select
    "hf-gpu.yaml": ("torch", "hf"),
    "sglang.yaml": ("torch", "sglang"),
    "openai.yaml": ("torch", "openai"),
    "verl.yaml": ("verl", 1),
    "verl-multinode.yaml": ("verl", 2),
}


def header(text: str) -> str:
    return "\n".join(re.match(r"((?:#.*\n)+)", text).group(1).splitlines())


def test_one_example_per_backend():
    assert sorted(p.name for p in EXAMPLES.glob("*.yaml")) == sorted(BACKENDS)


@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_example_validates_compiles_and_documents_itself(name, tmp_path):
    text = (EXAMPLES / name).read_text()
    cfg = PipelineConfig.model_validate(yaml.safe_load(text))
    backend, detail = BACKENDS[name]
    assert cfg.train_backend == backend
    if backend == "verl":
        assert cfg.verl.nnodes == detail
    else:
        assert cfg.rollout.backend.name == detail

    # the header: purpose, the launch command for THIS file, and an override that applies
    head = header(text)
    assert len(head.splitlines()) >= 8 and f"--config configs/examples/{name}" in head
    override = head.split("Override example", 1)[1].split("\n", 1)[1]
    patch = yaml.safe_load("\n".join(line.removeprefix("#  ") for line in override.splitlines()))
    merged = yaml.safe_load(text)
    for key, value in patch.items():
        merged[key] = _merge(merged.get(key), value)
    assert PipelineConfig.model_validate(merged) != cfg

    spec = next(yaml.safe_load_all(open(compile_pipeline(cfg, str(tmp_path / "p.yaml")))))
    executors = spec["deploymentSpec"]["executors"]
    if backend == "verl":
        assert "exec-train-verl" in executors and "exec-rollout" not in executors
    else:
        shards = "exec-rollout-shard" in executors
        assert shards == (cfg.rollout.shards > 1)


def _merge(base, patch):
    if isinstance(base, dict) and isinstance(patch, dict):
        return {**base, **{k: _merge(base.get(k), v) for k, v in patch.items()}}
    return patch
