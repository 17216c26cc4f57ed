"""`sparring run`'s time estimate: how it scales with the work a config asks for, and the
progress lines. Not whether it reproduces the runs its costs were measured on (that would only
check the fit)."""

from __future__ import annotations

import io
import itertools

import pytest

from sparring import peak_flops
from sparring.cli.options import load_config
from sparring.loop.config import CONFIG_DIR, DEFAULT_CONFIG, PipelineConfig
from sparring.loop.estimate import (
    COSTS,
    COSTS_BF16,
    Probe,
    costs_for,
    decodes_bf16,
    estimate_here,
    estimate_seconds,
    eval_games,
    games_on_test,
    probe,
    work,
)
from sparring.loop.local import _Progress


def config(path=DEFAULT_CONFIG, **overrides) -> PipelineConfig:
    """A shipped config with dotted overrides (`"game.params.max_turns": 4`)."""
    return load_config(PipelineConfig, str(path), overrides)


def seconds(**overrides) -> float:
    """The estimate of the embedded default with `overrides`, at the reference CPU."""
    return estimate_seconds(config(**overrides))


def test_time_grows_linearly_with_games_per_iteration():
    """Each game adds the same rollout and train cost: equal steps add equal time."""
    t = [seconds(games_per_iteration=g) for g in (64, 128, 192, 256)]
    steps = [b - a for a, b in itertools.pairwise(t)]
    assert steps[0] > 0 and steps == pytest.approx([steps[0]] * 3)
    assert t[0] > steps[0]  # fixed costs (task start-up, warm start, eval) stay


def test_each_iteration_adds_the_same_time():
    t = [seconds(iterations=n) for n in (1, 2, 4, 8)]
    per_iteration = t[1] - t[0]
    assert per_iteration > 0
    assert [b - t[0] for b in t[1:]] == pytest.approx([per_iteration * k for k in (1, 3, 7)])


def test_longer_games_cost_more_but_not_the_train_step():
    """More turns or more tokens per turn lengthen the rollout and eval games, linearly in
    their product; the GRPO update's cost per game does not depend on it."""
    short, long = seconds(**{"game.params.max_turns": 4}), seconds()  # the default's 8
    assert long > short
    assert seconds(**{"game.params.max_turns": 12}) - long == pytest.approx(long - short)
    tokens = {"rollout.sampling.max_new_tokens": 20, "eval.rollout.sampling.max_new_tokens": 20}
    assert seconds(**tokens) < long
    assert long < 2 * short  # the train and start-up costs do not double


def test_more_evaluation_and_warm_start_cost_more():
    default = seconds()
    assert seconds(**{"game_init.num_val": 128}) > default
    assert seconds(**{"eval.modes": ["selfplay", "vs_scripted"]}) > default  # the default: selfplay
    assert seconds(**{"warm_start.num_states": 600}) > default
    assert seconds(**{"warm_start.train.epochs": 6}) > default


def test_eval_games_count_each_mode_and_seat():
    cfg = config()
    assert eval_games(cfg) == cfg.game_init.num_val * (1 + 2 * ("vs_scripted" in cfg.eval.modes))
    both = {"eval.modes": ["selfplay", "vs_scripted"]}
    assert eval_games(config(**both, **{"eval.num_games": 16})) == 16 * 3  # fewer than num_val


def test_diplomacy_plays_every_bot_on_val_and_only_the_champions_on_test():
    """vs_scripted on val plays each of the 4 bots in each of the 7 countries; the test step
    plays only the champion metric's games (greedy), for the start and the final model."""
    cfg = config(CONFIG_DIR / "diplomacy-ablation.yaml")
    assert eval_games(cfg) == cfg.game_init.num_val * 4 * 7
    assert games_on_test(cfg) == 2 * cfg.game_init.num_test * 7
    off = config(CONFIG_DIR / "diplomacy-ablation.yaml", **{"eval.breakdown": False})
    assert eval_games(off) == cfg.game_init.num_val * 7


def test_bypassing_the_old_log_prob_pass_saves_train_time_only():
    """`bypass_mode` skips the trainer's old-log-prob pass: a share of each GRPO update, so the
    saving grows with the games trained and not with the length of the rollout's games."""

    def saving(**overrides) -> float:
        return seconds(**overrides, **{"train.bypass_mode": False}) - seconds(**overrides)

    assert saving() > 0
    assert saving(games_per_iteration=256) == pytest.approx(2 * saving())
    assert saving(**{"game.params.max_turns": 12}) == pytest.approx(saving())


def test_the_real_model_costs_more_than_the_tiny_one_on_the_same_work():
    assert seconds(model="smollm2-135m-instruct") > seconds()


def test_unmeasured_setups_get_no_estimate():
    cfg = config()
    assert estimate_seconds(cfg.model_copy(update={"model": "Qwen/Qwen2.5-0.5B"})) is None
    assert estimate_seconds(cfg.model_copy(update={"device": "cuda"})) is None


def test_a_machine_twice_as_slow_at_both_probes_doubles_all_but_the_per_task_share():
    cfg = config()
    costs = COSTS[cfg.model]
    ref, tasks = costs.reference, costs.task * work(cfg, costs.budget).tasks
    slow = Probe(2 * ref.train, 2 * ref.decode)
    assert estimate_seconds(cfg, slow) - tasks == pytest.approx(2 * (estimate_seconds(cfg) - tasks))


def test_each_probe_scales_its_own_kind_of_work():
    """A slower decode probe lengthens the games (rollout, eval), a slower update probe the
    GRPO update: the cost of longer games grows only with the first, the saving of
    `bypass_mode` (a share of the update) only with the second."""
    ref = COSTS["tiny"].reference
    slow_decode, slow_update = Probe(ref.train, 3 * ref.decode), Probe(3 * ref.train, ref.decode)

    def longer_games(probe: Probe | None) -> float:
        turns = [config(**{"game.params.max_turns": t}) for t in (8, 12)]
        return estimate_seconds(turns[1], probe) - estimate_seconds(turns[0], probe)

    def bypass_saving(probe: Probe | None) -> float:
        on, off = config(), config(**{"train.bypass_mode": False})
        return estimate_seconds(off, probe) - estimate_seconds(on, probe)

    assert longer_games(slow_decode) == pytest.approx(3 * longer_games(None))
    assert longer_games(slow_update) == pytest.approx(longer_games(None))
    assert bypass_saving(slow_update) == pytest.approx(3 * bypass_saving(None))
    assert bypass_saving(slow_decode) == pytest.approx(bypass_saving(None))


def test_the_probe_times_the_models_own_work_here():
    """Real passes of the tiny model: more rows take longer, and `estimate_here` scales the
    costs by what it measured."""
    small, large = probe("tiny", rows=1, seconds=0.2), probe("tiny", rows=16, seconds=0.2)
    assert 0 < small.train < large.train and 0 < small.decode < large.decode
    bf16 = probe("tiny", rows=1, seconds=0.0, train_bf16=True, decode_bf16=True)  # runs there
    assert 0 < bf16.train < 30 and 0 < bf16.decode < 30  # seconds, not ms: ~0.1 s idle
    cfg = config()
    seconds_here, here, ref = estimate_here(cfg)
    assert ref == COSTS["tiny"].reference and here.train > 0 and here.decode > 0
    assert seconds_here == estimate_seconds(cfg, here)
    assert estimate_here(cfg.model_copy(update={"device": "cuda"})) is None


def test_progress_echoes_progress_lines_with_elapsed_and_estimated_time():
    log, echo = io.StringIO(), io.StringIO()
    out = _Progress(log, echo, verbose=False, t0=0.0, estimate=605.0)
    out.write("noise\n[sparring] iteration 0: rollout reward 0.412\npartial")
    assert log.getvalue().endswith("partial")  # everything reaches the log
    (line,) = echo.getvalue().splitlines()
    clock, text = line.split("] ", 1)
    assert clock.endswith(" / ~10:05") and text == "[sparring] iteration 0: rollout reward 0.412"


def test_a_config_decoding_in_bf16_takes_the_bf16_costs_where_this_cpu_decodes_in_bf16():
    """The bf16 engine gains less over fp32 than the probe does, so its games have costs of
    their own; on a CPU without bf16 instructions the engine stays fp32, and so do the costs."""
    bf16 = config(CONFIG_DIR / "pipeline-smollm2.yaml")
    fp32 = config(CONFIG_DIR / "pipeline-smollm2.yaml", **{"rollout.backend.quantize": "none"})
    assert bf16.rollout.backend.quantize == "bf16" and not decodes_bf16(fp32)
    assert costs_for(fp32) is COSTS[fp32.model]
    here = peak_flops.cpu_bf16("auto")  # this CPU's own answer, as the engine's
    assert decodes_bf16(bf16) == here
    assert costs_for(bf16) is (COSTS_BF16[bf16.model] if here else COSTS[bf16.model])
    assert costs_for(config(**{"rollout.backend.quantize": "bf16"})) is COSTS["tiny"]  # none
    assert costs_for(bf16.model_copy(update={"model": "Qwen/Qwen2.5-0.5B"})) is None
