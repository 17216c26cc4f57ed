"""Role-conditioned advantages (sparring.rae): the EMA by hand, and a baseline that survives a
restart and a retried update without counting a batch twice."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from sample_frames import make_samples
from transformers import AutoTokenizer

from sparring import storage
from sparring.rae import BASELINE_FILE, RoleBaseline
from sparring.train import train
from sparring.train_config import GRPOConfig

RAE = GRPOConfig(advantage="rae", rae_decay=0.5, mini_batch_size=8, micro_batch_size=4)


def test_the_baseline_moves_by_hand():
    b = RoleBaseline(decay=0.5)
    # batch 1: p0 first seen at its mean 0.5, so b = 0.5 and A = +-0.5; p1 at 1.0, A = 0
    adv = b.advantages(np.array(["p0", "p0", "p1", "p1"]), np.array([1.0, 0.0, 1.0, 1.0]))
    assert adv.tolist() == [0.5, -0.5, 0.0, 0.0]
    # batch 2: p0 = 0.5 * 0.5 + 0.5 * 1.0 = 0.75, so A = 1 - 0.75 = 0.25 for both rows
    assert b.advantages(np.array(["p0", "p0"]), np.array([1.0, 1.0])).tolist() == [0.25, 0.25]
    assert b.values == {"p0": 0.75, "p1": 1.0} and b.updates == {"p0": 2, "p1": 1}


def test_save_load_and_a_corrupt_file(tmp_path):
    b = RoleBaseline(0.9, {"Player 0": 0.4}, {"Player 0": 3})
    b.save(tmp_path)
    assert RoleBaseline.load(tmp_path, 0.9) == b
    assert RoleBaseline.load(tmp_path / "none", 0.9) == RoleBaseline(0.9)  # no file: fresh
    (tmp_path / BASELINE_FILE).write_text("{not json")
    with pytest.raises(ValueError, match="not a RAE baseline file"):
        RoleBaseline.load(tmp_path, 0.9)


@pytest.fixture(scope="module")
def batches(tiny_model_dir, tmp_path_factory):
    """Two rollouts' samples: the proposer wins more in the first, less in the second."""
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    root = tmp_path_factory.mktemp("rae-samples")
    paths = []
    for k, rewards in enumerate(([1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0, 0.0], [0.0, 1.0] * 4)):
        paths.append(root / f"{k}.parquet")
        make_samples(tok, rewards).to_parquet(paths[-1])
    return paths


def baseline_of(checkpoint) -> dict:
    return json.loads((checkpoint / BASELINE_FILE).read_text())


def test_the_baseline_travels_with_the_checkpoint_through_a_restart_and_a_retry(
    tiny_model_dir, batches, tmp_path
):
    first = train(tiny_model_dir, [batches[0]], tmp_path / "1", RAE, device="cpu").out_dir
    # batch 1: proposer rewards 1, 1, 1, 0 -> 0.75; reviewer 0, 0, 1, 0 -> 0.25 (first sight)
    assert baseline_of(first)["values"] == {"proposer": 0.75, "reviewer": 0.25}
    second = train(first, [batches[1]], tmp_path / "2", RAE, device="cpu")
    # batch 2: proposer all 0 -> 0.5 * 0.75 = 0.375; reviewer all 1 -> 0.5 * 0.25 + 0.5 = 0.625
    assert baseline_of(second.out_dir)["values"] == {"proposer": 0.375, "reviewer": 0.625}
    assert baseline_of(second.out_dir)["updates"] == {"proposer": 2, "reviewer": 2}
    assert second.metrics["train/rae/proposer/baseline"] == 0.375
    # a retried task starts again from the same input checkpoint: the batch counts once
    retried = train(first, [batches[1]], tmp_path / "2-retry", RAE, device="cpu").out_dir
    assert baseline_of(retried) == baseline_of(second.out_dir)
    # a resumed run downloads the stored checkpoint: the baseline continues where it was
    stored = f"file://{tmp_path / 'store'}/run/0/checkpoint"
    storage.upload_dir(first, stored)
    shutil.rmtree(first)
    restored = storage.download_dir(stored, tmp_path / "restored")
    resumed = train(restored, [batches[1]], tmp_path / "2-resumed", RAE, device="cpu").out_dir
    assert baseline_of(resumed) == baseline_of(second.out_dir)
