"""The SFT control (sparring.loop.control): GRPO's budget spent on SFT from the teacher."""

from __future__ import annotations

from pathlib import Path

import pytest
from safetensors.torch import load_file

from sparring.cli.options import load_config, parse_params
from sparring.loop.config import PipelineConfig
from sparring.loop.control import control_config, scores_on_test
from sparring.loop.runner import run_loop

ROOT = Path(__file__).resolve().parents[2]
# configs/pipeline.yaml at the smallest size that warm-starts, plays, trains and evaluates
TINY = ("iterations=1", "games_per_iteration=8", "game_init.num_val=2", "game_init.num_test=2")
TINY += ("game_init.num_train=8",)  # a recipe's 512 2x2 states take ~40 s to generate
TINY += ("warm_start.num_states=4", "warm_start.train.epochs=1", "game.params.max_turns=2")
TINY += ("rollout.sampling.max_new_tokens=8", "eval.rollout.sampling.max_new_tokens=8")
TINY += ("eval.modes=[selfplay]", "evaluate_start=true", "tracking.enabled=false")
TINY += ("train.mini_batch_size=8", "train.micro_batch_size=8", "train.rejected_credit=penalty")


def tiny_config(model: Path, store: Path) -> PipelineConfig:
    sets = (*TINY, f"model={model}", f"storage.root={store}")
    return load_config(PipelineConfig, str(ROOT / "configs" / "pipeline.yaml"), parse_params(sets))


def max_change(a: Path, b: Path) -> float:
    """The largest absolute difference between two checkpoints' weights."""
    x, y = (load_file(Path(d) / "model.safetensors") for d in (a, b))
    return max((x[k] - y[k]).abs().max().item() for k in x)


def test_the_control_takes_grpos_steps_and_evaluates_on_the_same_states(tiny_model_dir, tmp_path):
    """Each control iteration takes as many optimizer steps as the GRPO update it replaces,
    plays no rollout, and the two runs score the same warm start on the same val and test
    games with the same draws. The control's own learning rate reaches its rounds: at 1e-12
    its steps leave the weights as they were."""
    cfg = tiny_config(tiny_model_dir, tmp_path / "store")
    grpo = run_loop(cfg.model_copy(update={"run_name": "grpo"}), tmp_path / "grpo")
    control = control_config(cfg, [it.metrics for it in grpo.iterations], lr=1e-12)
    assert (
        control.sft_control.lr == 1e-12 and control.warm_start.train.lr == cfg.warm_start.train.lr
    )
    sft = run_loop(control.model_copy(update={"run_name": "sft"}), tmp_path / "sft")

    grpo_steps = [it.metrics["train/optimizer_steps"] for it in grpo.iterations]
    assert all(n > 0 for n in grpo_steps)  # the tiny rollout has signal: the budget is real
    assert [it.metrics["train/optimizer_steps"] for it in sft.iterations] == grpo_steps
    assert all("warm_start/teacher_reward" in it.metrics for it in sft.iterations)
    assert not (tmp_path / "sft" / "0" / "rollout").exists()  # no self-play, no GRPO
    assert sft.start.val_scores == grpo.start.val_scores  # one warm start, one evaluation
    for a, b in zip(grpo.iterations, sft.iterations, strict=True):
        assert a.val_scores.keys() == b.val_scores.keys() == grpo.start.val_scores.keys()
    grpo_test, sft_test = scores_on_test(tmp_path / "grpo"), scores_on_test(tmp_path / "sft")
    assert sft_test["start"] == grpo_test["start"] and len(grpo_test["start"]) == 2
    assert sft_test["final"].keys() == grpo_test["final"].keys()
    moved = [max_change(run.start.model_dir, run.iterations[-1].model_dir) for run in (grpo, sft)]
    assert moved[0] > 1e-4 > 1e-6 > moved[1]  # GRPO's steps moved the weights, the control's not


def test_control_budgets(tiny_model_dir, tmp_path):
    """Steps come from GRPO's optimizer steps (0 without signal), wall time from its rollout
    and update seconds; the recipe wants one budget per iteration and the teacher's SFT."""
    cfg = tiny_config(tiny_model_dir, tmp_path)
    ran = [{"train/optimizer_steps": 3.0, "perf/rollout_seconds": 2.0, "perf/train_seconds": 1.5}]
    ran.append({"train/no_signal": 1.0, "perf/rollout_seconds": 2.5, "perf/train_seconds": 0.0})
    cfg = cfg.model_copy(update={"iterations": 2})
    assert control_config(cfg, ran).sft_control.steps == [3, 0]
    assert control_config(cfg, ran, "wall").sft_control.seconds == [3.5, 2.5]
    with pytest.raises(ValueError, match="one per iteration"):
        control_config(cfg, ran[:1])
    no_teacher = cfg.model_copy(update={"warm_start": None})
    with pytest.raises(ValueError, match="set warm_start"):
        control_config(no_teacher, ran)


def test_the_magnet_moves_to_the_model_that_trains_next(tiny_model_dir, tmp_path):
    """`magnet_every: 2` over 3 iterations: each update is one optimizer step, whose KL term is
    taken before it moves the policy. Iteration 0 trains the start against the start (KL 0);
    iteration 1 trains iteration 0's model against the start (KL > 0); iteration 1 moves the
    magnet to its model, which iteration 2 trains (KL 0 again). The test scores the start."""
    sets = ("iterations=3", "magnet_every=2", "train.kl_coef=0.1", "train.mini_batch_size=64")
    sets += ("train.micro_batch_size=16", "train.epochs=1", "evaluate_start=false")
    cfg = load_config(
        PipelineConfig,
        str(ROOT / "configs" / "pipeline.yaml"),
        parse_params((*TINY, *sets, f"model={tiny_model_dir}", f"storage.root={tmp_path / 's'}")),
    )
    run = run_loop(cfg, tmp_path / "work")
    steps = [it.metrics["train/optimizer_steps"] for it in run.iterations]
    assert steps == [1, 1, 1]  # every update had signal and took its one step
    kl = [it.metrics["train/kl"] for it in run.iterations]
    assert kl[0] == pytest.approx(0, abs=1e-7) and kl[2] == pytest.approx(0, abs=1e-7)
    assert kl[1] > 1e-6
    assert max_change(tmp_path / "work" / "warm", run.iterations[0].model_dir) > 1e-4
