"""How long `sparring run` should take: a rough wall-time estimate printed at the start.

Only for models whose costs per unit below were measured on CPU, each from the per-task times
of one run on 2 idle cores (`bench/estimate.py`, which prints them): the tiny model on `make
run`'s config, SmolLM2-135M-Instruct on `configs/pipeline-smollm2.yaml` cut to one iteration
of 32 games and 32 val and test states (docs/results.md#the-time-estimate-against-the-runs).
Another model or a GPU gets no estimate. The rollout and eval costs are per game at the
measured per-turn budget (`max_new_tokens` times the game's `Game.turn_budget`, matching's
`max_turns`) and scale with it; a policy that ends its games early is faster.

`estimate_here` scales the costs to this machine by `probe`: the model's own forward and
backward pass (for the warm start and the updates) and its cached decoding (for rollouts and
evaluations), timed here against the same probe where the costs were measured, each at the
precision the config computes in here (bf16 for the updates under `train.cpu_bf16`, for the
games under `rollout.backend.quantize: bf16`, where this CPU has bf16 instructions). A config
whose games decode in bf16 takes SmolLM2's bf16 costs (`COSTS_BF16`, from a bf16 run of
`configs/pipeline-smollm2.yaml`), the others the fp32 ones. The two probes change differently
across machines (on one core instead of two the tiny model's updates took 1.8x as long, its
games 1.3-1.4x), and a matmul probe tracked neither (it was 2x over on an AVX-512 CPU, whose
gains on the tiny model's small products, elementwise ops and Python it missed).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from typing import NamedTuple

from sparring import peak_flops
from sparring.evaluate import lineups
from sparring.loop import tasks
from sparring.loop.config import PipelineConfig

# Share of a GRPO update that `bypass_mode` skips, the trainer's old-log-prob pass (13% and
# 21% measured: docs/results.md#what-bypass_mode-saves-in-a-grpo-step); COSTS' train costs
# were measured with the pass.
BYPASS_SAVING = 0.13
PROBE_TOKENS = 128  # the probe's sequences: trained, or prompts for a 16-token reply


class Probe(NamedTuple):
    """Seconds one machine takes for a model's two kinds of work (`probe`)."""

    train: float  # forward and backward of `rows` x PROBE_TOKENS tokens
    decode: float  # prefill 4 x `rows` x PROBE_TOKENS tokens, then 16 cached one-token steps


class Costs(NamedTuple):
    """Measured seconds per unit of work for one model on idle CPU cores."""

    sft: float  # per warm-start state and epoch: the SFT pass
    rollout: float  # per self-play game
    train: float  # per self-play game: the GRPO update on its samples
    eval: float  # per eval game
    task: float  # per task, outside its compute: start-up, scripted games, S3, MLflow, saving
    budget: int  # max_new_tokens x turn budget the per-game costs were measured at
    rows: int  # the probe's batch for this model
    reference: Probe  # the probe on the machine where the costs were measured


# Fitted by bench/estimate.py; the references are the probes of those runs (SmolLM2's probed again
# on that machine once the probe bounded the heap as the tasks do). SmolLM2's fp32 costs predate
# the trainer's heap scopes and the probe's reuse of the heap, and no run has checked them since.
COSTS = {
    "tiny": Costs(
        sft=0.0569,
        rollout=0.100,
        train=0.171,
        eval=0.104,
        task=0.83,
        budget=40 * 8,
        rows=4,
        reference=Probe(train=0.0316, decode=0.0688),
    ),
    "smollm2-135m-instruct": Costs(
        sft=3.59,
        rollout=1.58,
        train=7.23,
        eval=1.63,
        task=2.5,
        budget=48 * 6,
        rows=1,
        reference=Probe(train=0.875, decode=1.76),  # about the median of bounded probes there
    ),
}


# The bf16 engine gains less over fp32 than the decode probe does (its games 1.5-1.7x the
# probe-scaled fp32 costs on two machines), so a config that decodes in bf16 takes costs fitted
# on a bf16 run: `configs/pipeline-smollm2.yaml` without the start's and the test evaluations,
# on CPU-2e with the trainer's heap scopes. Its probe takes 8 rows: at one row it read one
# CPU-2e host 1.6-2x slower than another where the work took 1.0-1.3x as long, and spread
# 20-30% between fresh processes (docs/results.md#the-time-estimate-against-the-runs).
COSTS_BF16 = {
    "smollm2-135m-instruct": Costs(
        sft=2.78,
        rollout=1.38,
        train=5.20,
        eval=1.05,
        task=4.7,
        budget=48 * 6,
        rows=8,
        reference=Probe(train=4.04, decode=5.42),  # the median of three fresh probes there
    ),
}


def decodes_bf16(cfg: PipelineConfig) -> bool:
    """Whether `cfg`'s games decode in bf16 on this CPU (`rollout.backend.quantize: bf16`
    where the CPU has bf16 instructions, as the engine decides)."""
    return cfg.rollout.backend.quantize == "bf16" and peak_flops.cpu_bf16("auto")


def costs_for(cfg: PipelineConfig) -> Costs | None:
    """The measured costs of `cfg`'s model at the precision its games decode in here (the
    fp32 costs where no bf16 ones were measured), None for a model without costs."""
    if cfg.model in COSTS_BF16 and decodes_bf16(cfg):
        return COSTS_BF16[cfg.model]
    return COSTS.get(cfg.model)


def eval_games(cfg: PipelineConfig) -> int:
    """Model games one evaluation plays: each val state once per lineup
    (`sparring.evaluate.lineups`)."""
    states = min(cfg.game_init.num_val, cfg.eval.num_games or cfg.game_init.num_val)
    return states * len(lineups(cfg.eval, previous=True))


def games_on_test(cfg: PipelineConfig) -> int:
    """Model games the test evaluation plays: every test state once per lineup of the champion
    metric's mode (`tasks.test_eval`), for the start and the final model."""
    test = lineups(tasks.test_eval(cfg, baselines=False), previous=True)
    return 2 * cfg.game_init.num_test * len(test)


class Work(NamedTuple):
    """How much of each kind of work a config asks for, in the units of `Costs`."""

    sft: float  # warm-start states x epochs
    rollout: float  # self-play games, times their token budget over the costs' budget
    train: float  # self-play games trained, less the share `bypass_mode` skips
    eval: float  # eval games (per iteration, the start's and the test's), budget-scaled
    tasks: int  # steps run: start, init, model, warm start, 4 per iteration, test, finish


def work(cfg: PipelineConfig, budget: int) -> Work:
    """`cfg`'s work, its games' lengths counted against `budget` tokens per game. With
    `average`, its evaluation and three tasks count; its SFT does not (how many distinct rows
    it trains on is known only after the run)."""
    turns = cfg.game.cls.turn_budget(cfg.game.params)
    length = cfg.rollout.sampling.max_new_tokens * turns / budget
    ws, averaged = cfg.warm_start, cfg.average is not None
    evals = (cfg.iterations + cfg.evaluate_start + averaged) * eval_games(cfg)
    evals += games_on_test(cfg)
    steps = 4 + (ws is not None) + 4 * cfg.iterations + cfg.evaluate_start + 3 * averaged
    return Work(
        sft=ws.num_states * ws.train.epochs if ws else 0.0,
        rollout=cfg.iterations * cfg.games_per_iteration * length,
        train=cfg.iterations
        * cfg.games_per_iteration
        * (1 - BYPASS_SAVING * cfg.train.bypass_mode),
        eval=evals * length,
        tasks=steps + (cfg.game_init.num_test > 0),
    )


def estimate_seconds(cfg: PipelineConfig, probe: Probe | None = None) -> float | None:
    """Wall seconds of `cfg` on idle CPU cores whose `probe` of the model took `probe` (None:
    the machine where the costs were measured), or None for a model without measured costs or
    off CPU."""
    if cfg.device != "cpu" or cfg.train_backend != "torch" or (costs := costs_for(cfg)) is None:
        return None
    w, ref = work(cfg, costs.budget), costs.reference
    update, decode = (probe.train / ref.train, probe.decode / ref.decode) if probe else (1, 1)
    return (
        w.tasks * costs.task
        + update * (w.sft * costs.sft + w.train * costs.train)
        + decode * (w.rollout * costs.rollout + w.eval * costs.eval)
    )


def estimate_here(cfg: PipelineConfig) -> tuple[float, Probe, Probe] | None:
    """`estimate_seconds` for this machine, this machine's probe and the reference one; None
    where there is no estimate (and then no probe)."""
    if estimate_seconds(cfg) is None:
        return None
    costs = costs_for(cfg)
    here = probe(
        cfg.model,
        costs.rows,
        train_bf16=peak_flops.cpu_bf16(cfg.train.cpu_bf16),
        decode_bf16=decodes_bf16(cfg),
    )
    return estimate_seconds(cfg, here), here, costs.reference


def probe(
    model: str,
    rows: int,
    seconds: float = 1.0,
    train_bf16: bool = False,
    decode_bf16: bool = False,
) -> Probe:
    """Time `model`'s own work on this machine, the best of repeats taken in turn over about
    `seconds` (at least two of each, after a warm-up: a stall of the machine must outlast the
    whole probe to slow it): a forward and backward pass of `rows` x PROBE_TOKENS random tokens, and
    prefilling 4 x `rows` x PROBE_TOKENS tokens then decoding 16 more with the KV cache (what
    the rollout engine does, on the larger batches of many games; a game's first prompt is
    longer still, ~300 tokens for matching). The C heap is bounded for a large model as the
    engine and the trainer bound it (`sparring.heap.bound_for`): unbounded, SmolLM2's forward
    and backward read .72 s in some processes and .85-.94 s in others on one machine, the
    blocks landing on the heap or in fresh mappings by the process's history; bounded, .86-.90
    s in every one. Each pass then reuses the heap as the trainer's and the engine's do
    (`sparring.heap.reusing_model`). `train_bf16` runs the pass under CPU bf16 autocast (as
    `train.cpu_bf16` does), `decode_bf16` decodes with a bf16 copy attending as the engine
    does (`sparring.generation.attention`)."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging

    from sparring import heap, model_zoo
    from sparring.generation import attention

    logging.disable_progress_bar()  # loading bars would precede the estimate
    try:
        path = model_zoo.fetch(model)
        net = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    finally:
        logging.enable_progress_bar()
    heap.bound_for(sum(p.numel() for p in net.parameters()))  # the tasks' heap, as they set it
    decoder = net
    if decode_bf16:  # a bf16 copy attending as the engine does
        decoder = copy.deepcopy(net).to(torch.bfloat16)
        decoder.set_attn_implementation(attention.register())
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(net.config.vocab_size, (rows, PROBE_TOKENS), generator=gen)
    prompts = torch.randint(net.config.vocab_size, (4 * rows, PROBE_TOKENS), generator=gen)

    def train() -> None:
        net.zero_grad(set_to_none=True)
        with (
            torch.autocast("cpu", dtype=torch.bfloat16, enabled=train_bf16),
            heap.reusing_model(net),  # the trainer's passes reuse the heap
        ):
            net(ids, labels=ids).loss.backward()

    @torch.no_grad()
    def decode() -> None:
        with heap.reusing_model(decoder):  # as the engine's prefill and decode steps
            out = decoder(prompts, use_cache=True)
            for _ in range(16):
                step = out.logits[:, -1:].argmax(-1)
                out = decoder(step, past_key_values=out.past_key_values, use_cache=True)

    return Probe(*_fastest((train, decode), seconds))


def _fastest(calls: tuple[Callable[[], None], ...], seconds: float) -> list[float]:
    """Each call's fastest time, the calls made in turn (after one warm-up each) for about
    `seconds` and at least twice."""
    for f in calls:
        f()
    best, rounds, t_end = [float("inf")] * len(calls), 0, time.perf_counter() + seconds
    while rounds < 2 or time.perf_counter() < t_end:
        for i, f in enumerate(calls):
            t0 = time.perf_counter()
            f()
            best[i] = min(best[i], time.perf_counter() - t0)
        rounds += 1
    return best
