"""optimizer_state: carry: AdamW's moments and the lr schedule continue from one update to the
next through a file beside the checkpoint; a retry or a resume continues from the same state."""

from __future__ import annotations

import math

import pytest
import torch
from sample_frames import make_samples
from transformers import AutoTokenizer

from sparring.loop.config import PipelineConfig
from sparring.train import OPTIMIZER_FILE, load_optimizer, train
from sparring.train_config import GRPOConfig

CARRY = GRPOConfig(optimizer_state="carry", mini_batch_size=4, micro_batch_size=4, lr=1e-3)


@pytest.fixture(scope="module")
def samples(tiny_model_dir, tmp_path_factory):
    path = tmp_path_factory.mktemp("carry") / "samples.parquet"
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    make_samples(tok, [1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.2, 0.8]).to_parquet(path)
    return path


def moments(folder) -> torch.Tensor:
    """The first parameter's AdamW first moment in `folder`'s optimizer state."""
    return load_optimizer(folder)["optimizer"]["state"][0]["exp_avg"]


def test_adam_continues_across_updates_and_a_retry_continues_from_the_same_state(
    tiny_model_dir, samples, tmp_path
):
    first = train(
        tiny_model_dir,
        [samples],
        tmp_path / "1",
        CARRY,
        device="cpu",
        optimizer_out=tmp_path / "o1",
    ).out_dir
    state = load_optimizer(tmp_path / "o1")
    assert state["step"] == 2  # 8 rows in mini-batches of 4
    assert int(state["optimizer"]["state"][0]["step"]) == 2
    assert not (first / OPTIMIZER_FILE).exists()  # beside the checkpoint, never in it

    def second(name):
        train(first, [samples], tmp_path / name, CARRY, device="cpu",
              optimizer_in=tmp_path / "o1", optimizer_out=tmp_path / f"o-{name}")  # fmt: skip
        return load_optimizer(tmp_path / f"o-{name}")

    carried = second("2")
    assert carried["step"] == 4 and int(carried["optimizer"]["state"][0]["step"]) == 4
    retried = second("2-retry")  # a retried task reads the same input state: no double count
    assert retried["step"] == 4
    assert torch.allclose(retried["optimizer"]["state"][0]["exp_avg"], moments(tmp_path / "o-2"))
    fresh = train(first, [samples], tmp_path / "f", CARRY, device="cpu",
                  optimizer_out=tmp_path / "o-fresh")  # fmt: skip
    assert fresh.metrics and load_optimizer(tmp_path / "o-fresh")["step"] == 2  # a new AdamW
    assert not torch.allclose(moments(tmp_path / "o-fresh"), moments(tmp_path / "o-2"))


def test_a_corrupt_optimizer_state_fails_clearly(tiny_model_dir, samples, tmp_path):
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / OPTIMIZER_FILE).write_bytes(b"not a torch file")
    with pytest.raises(ValueError, match="is not an optimizer state"):
        train(tiny_model_dir, [samples], tmp_path / "x", CARRY, device="cpu",
              optimizer_in=tmp_path / "o")  # fmt: skip


def test_carry_spans_the_runs_schedule_and_needs_full_fine_tuning():
    cfg = PipelineConfig.model_validate({"iterations": 5, "train": {"optimizer_state": "carry"}})
    assert cfg.train.lr_schedule_updates == 5
    with pytest.raises(ValueError, match="full fine-tuning"):
        GRPOConfig(optimizer_state="carry", lora_rank=8)


def test_a_fresh_adamw_takes_its_updates_share_of_a_schedule_over_the_run(
    tiny_model_dir, samples, tmp_path
):
    """LoRA can't carry AdamW, but a cosine schedule over the run still anneals its updates:
    update k of N runs at the k-th share of the schedule; N = 1 restarts it every update."""

    def lrs(span, update):
        cfg = GRPOConfig(mini_batch_size=4, micro_batch_size=4, lr=1e-3, lr_schedule="cosine",
                         lr_schedule_updates=span)  # fmt: skip
        seen = []
        train(tiny_model_dir, [samples], tmp_path / f"{span}-{update}", cfg,
              on_step=lambda step, m: seen.append(m["lr"]), device="cpu", update=update)  # fmt: skip
        return seen

    # 2 steps an update (8 rows, mini-batches of 4): update 0 of 4 at 1 and cos(pi/8)-ish,
    # update 3 at the schedule's last quarter
    assert lrs(4, 0) == pytest.approx([1e-3, 1e-3 * 0.5 * (1 + math.cos(math.pi / 8))])
    assert lrs(4, 3) == pytest.approx(
        [1e-3 * 0.5 * (1 + math.cos(math.pi * k / 8)) for k in (6, 7)]
    )
    assert lrs(1, 3) == lrs(1, 0) == pytest.approx([1e-3, 0.5e-3])  # a schedule per update
