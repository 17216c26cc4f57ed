"""Does self-play GRPO improve a policy? The whole loop with fixed seeds, on CPU or a GPU.

    .venv/bin/python bench/learning.py                 # tiny model, ~20 min on 2 idle cores
    .venv/bin/python bench/learning.py --model smollm2-135m-instruct   # real model, < 90 min
    python bench/learning.py --model smollm2-135m-instruct --device cuda --batch-size 256 \\
        --max-live-games 256 --train-states 32   # a larger setting on one GPU (docs/results.md)
    .venv/bin/python bench/learning.py --iterations 1 --train-states 4 --games-per-init 2 \\
        --val-states 4 --sft-states 8 --sft-epochs 1   # smoke size

1. the model: the tiny one (built here, random weights) or any model ref (`--model`: a named
   real model such as smollm2-135m-instruct, a hub name, a path), evaluated zero-shot;
2. optionally (`--sft-states` > 0) warm-start it with SFT on scripted self-play of its own
   train states;
3. K iterations of self-play rollout -> GRPO (group key `init`) -> evaluation on held-out
   val states. Matching k=3 with `random_names=False`: the 1.3M-parameter tiny model can't
   learn to copy random names from its table in a CPU budget (docs/training.md).

A real model gets its own defaults (`REAL_DEFAULTS`, picked to finish within 90 minutes on 2
idle CPU cores): fewer and shorter games, a one-epoch SFT, LoRA adapters (rank 16).

Evaluation plays every val state in self-play twice: sampled at the rollout temperature (the
policy GRPO optimises; fixed seed, so every iteration sees the same random stream) and greedy.
Prints the curve with the GRPO diagnostics that explain it (zero-variance groups, clip
fraction, KL, grad norm), saves learning.png and learning.json, and ends with
`RESULT learning_gain <final - start sampled val reward>` (`real_learning_gain` for a model
other than the tiny one), where start is the model the GRPO iterations begin from (after the
warm start, if any): the figure measures self-play GRPO alone.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from sparring import recipe
from sparring.evaluate import EvalConfig, evaluate
from sparring.game_init import GameInitConfig, write_inits
from sparring.games import GameSpec
from sparring.generation.base import SamplingParams
from sparring.generation.hf import HFBackend
from sparring.models import resolve_model
from sparring.rollout import RolloutConfig, load_inits
from sparring.sft import SFTConfig
from sparring.tiny_model import init_tiny
from sparring.train import GRPOConfig

# `--model` other than tiny: sized for a 135M model on 2 idle CPU cores (57 min measured in one
# run: the zero-shot evaluation on 64 states 4 min, the warm start and its evaluation 14, each
# GRPO iteration 17-23 with its rollout, update and evaluation). A deliberately short warm start
# (one epoch, 6 steps) teaches the protocol; two epochs already imitate the teacher
# (docs/results.md). LoRA: a cheaper backward, no full AdamW state. Sampled evaluation only
# (greedy doubles it) on 256 states, for a paired standard error of the gain under 0.03; the
# zero-shot one is not part of the gain and uses 64. 64 live games keep the engine's KV cache
# under its 8 GiB cap (sparring.generation.hf).
REAL_DEFAULTS = {
    "iterations": 2,
    "max_turns": 6,
    "max_retries": 1,
    "train_states": 12,
    "games_per_init": 8,
    "val_states": 256,
    "zero_shot_states": 64,
    "max_live_games": 64,
    "sft_states": 48,
    "sft_epochs": 1,
    "sft_lr": 1e-3,
    "lr": 2e-4,
    "max_new_tokens": 48,
    "temperature": 0.7,  # at 1.0 SmolLM2-135M's replies drift into incoherent text
    "mini_batch": 32,
    "micro_batch": 4,
    "lora_rank": 16,
    "gradient_checkpointing": False,
    "greedy": False,
}


def val_metrics(
    backend: HFBackend,
    val: Path,
    rollout: RolloutConfig,
    greedy: bool,
    states: int | None = None,
) -> dict:
    """Self-play on the first `states` val states (None = all), sampled (`rollout.sampling`)
    and, with `greedy`, greedy. Keeps the sampled reward of every val state (`rewards`) for
    the paired standard error of the gain."""
    out: dict = {}
    modes = [("", rollout.sampling)]
    if greedy:
        modes.append(("greedy_", rollout.sampling.model_copy(update={"temperature": 0.0})))
    for name, params in modes:
        cfg = EvalConfig(
            rollout=rollout.model_copy(update={"sampling": params}),
            modes=["selfplay"],
            num_games=states,
        )
        m, episodes = evaluate(backend, val, cfg, progress=False)
        a = "eval/selfplay/player_a/"
        out |= {
            f"{name}reward": m["eval/selfplay/all/normalized_reward"],
            f"{name}reward_se": m[a + "normalized_reward_se"],
            f"{name}agreement": m[a + "agreement_rate"],
            f"{name}invalid": m[a + "invalid_rate"],
        }
        if not name:
            out["rewards"] = [float(np.mean(e.rewards)) for e in episodes["selfplay"]]
    return out


def paired_gain(start: dict, end: dict) -> tuple[float, float]:
    """Mean and standard error of the per-val-state change in sampled reward (same states,
    same sampling seeds: the pairing removes the states' own difficulty from the error)."""
    diff = np.array(end["rewards"]) - np.array(start["rewards"])
    se = diff.std(ddof=1) / np.sqrt(len(diff)) if len(diff) > 1 else float("nan")
    return float(diff.mean()), float(se)


def warm_start(
    model: str, states: list, game: GameSpec, args: argparse.Namespace, work: Path
) -> str:
    """2. SFT on scripted self-play of `states`; returns the checkpoint path."""
    cfg = SFTConfig(
        lr=args.sft_lr,
        epochs=args.sft_epochs,
        mini_batch_size=16,
        micro_batch_size=args.micro_batch,
        lr_schedule="cosine",
        **trainer_options(args),
    )
    agent = game.cls.default_opponent
    warm = recipe.warm_start(model, RolloutConfig(game=game), agent, states, work / "iter-0", cfg)
    print(f"scripted teacher reward {warm.metrics['warm_start/teacher_reward']:.3f}")
    return str(warm.out_dir)


def trainer_options(args: argparse.Namespace) -> dict:
    """The trainer's device, weight dtype, LoRA and checkpointing settings (sparring.policy_model)."""
    return {
        "lora_rank": args.lora_rank,
        "gradient_checkpointing": args.gradient_checkpointing,
        "param_dtype": args.param_dtype,
        "device": args.device,
    }


def plot(curve: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = [c["iteration"] for c in curve]
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    for prefix, label, style in (("", "sampled", "o-"), ("greedy_", "greedy", "s--")):
        if prefix + "reward" not in curve[0]:
            continue
        ax.errorbar(
            x,
            [c[prefix + "reward"] for c in curve],
            yerr=[c[prefix + "reward_se"] for c in curve],
            fmt=style,
            capsize=3,
            label=f"val reward, {label}",
        )
    ax.plot(x, [c["agreement"] for c in curve], ":", label="agreement rate (sampled)")
    ax.plot(x, [c["invalid"] for c in curve], "-.", label="invalid-action rate (sampled)")
    ax.set_xlabel("GRPO iteration (0 = start; -1 = zero-shot, before the warm start)")
    ax.set_xticks(x)
    ax.set_ylim(0, 1.05)
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", default="tiny", help="tiny, or a model ref: named, hub, path")
    ap.add_argument("--iterations", type=int, default=6)
    ap.add_argument("--k", type=int, default=3, help="table size")
    ap.add_argument("--max-turns", type=int, default=8)
    ap.add_argument("--max-retries", type=int, default=2, help="retries of an invalid action")
    ap.add_argument("--random-names", action="store_true", help="dialop's random names (harder)")
    ap.add_argument("--train-states", type=int, default=24, help="states per rollout")
    ap.add_argument("--games-per-init", type=int, default=8, help="GRPO group size (key: init)")
    ap.add_argument("--val-states", type=int, default=128)
    ap.add_argument(
        "--zero-shot-states",
        type=int,
        help="val states of the zero-shot evaluation (default: all; it is not part of the gain)",
    )
    ap.add_argument(
        "--max-live-games",
        type=int,
        help="games in flight at once (default: all); bounds the engine's KV cache",
    )
    ap.add_argument(
        "--sft-states", type=int, default=600, help="scripted games for the warm start (0 = none)"
    )
    ap.add_argument("--sft-epochs", type=int, default=3)
    ap.add_argument("--sft-lr", type=float, default=3e-3)
    ap.add_argument("--lr", type=float, default=2e-4, help="GRPO learning rate")
    ap.add_argument("--epochs", type=int, default=1, help="PPO epochs per iteration")
    ap.add_argument("--mini-batch", type=int, default=32, help="sequences per optimizer step")
    ap.add_argument("--micro-batch", type=int, default=16, help="sequences per forward/backward")
    ap.add_argument("--lora-rank", type=int, default=0, help="> 0: train LoRA adapters only")
    ap.add_argument(
        "--gradient-checkpointing", action=argparse.BooleanOptionalAction, default=False
    )
    ap.add_argument(
        "--param-dtype",
        choices=["float32", "bfloat16"],
        default="float32",
        help="trained weights' dtype, also the checkpoints'",
    )
    ap.add_argument("--device", default="auto", help="cpu, cuda or auto (cuda when available)")
    ap.add_argument("--batch-size", type=int, default=64, help="rows per generate forward")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument(
        "--greedy",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also evaluate greedily (doubles evaluation time)",
    )
    ap.add_argument(
        "--invalid-penalty",
        type=float,
        default=0.0,
        help="reward shaping in the training rollouts only: minus this per invalid action",
    )
    ap.add_argument("--kl-coef", type=float, default=0.0)
    ap.add_argument(
        "--loss-agg-mode",
        default="seq-mean-token-mean",
        help="verl agg_loss mode; token-mean lets long failed games dominate (README)",
    )
    ap.add_argument("--group-key", default="init")
    ap.add_argument("--max-new-tokens", type=int, default=40)
    ap.add_argument(
        "--zero-shot",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="a real model: evaluate it before the warm start too (its failed games are long)",
    )
    ap.add_argument(
        "--warm-model",
        help="skip the warm start: use this SFT checkpoint (e.g. OUT/iter-0 "
        "of an earlier run with the same state arguments) to tune the RL settings",
    )
    ap.add_argument("--out", help="work directory (default: a temp dir)")
    if ap.parse_known_args()[0].model != "tiny":  # a real model's defaults; flags still win
        ap.set_defaults(**REAL_DEFAULTS)
    args = ap.parse_args()

    t_start = time.perf_counter()
    work = Path(args.out or tempfile.mkdtemp(prefix="sparring-learning-"))
    rules = {
        "k": args.k,
        "max_turns": args.max_turns,
        "max_retries": args.max_retries,
        "random_names": args.random_names,
    }
    game = GameSpec(name="matching", params=rules)
    sampling = SamplingParams(temperature=args.temperature, max_new_tokens=args.max_new_tokens)
    evals = (RolloutConfig(game=game, sampling=sampling, max_live_games=args.max_live_games),)
    evals += (args.greedy,)
    # 1. seeded states (the train split covers SFT and every rollout, disjointly), the model
    n_train = args.sft_states + args.iterations * args.train_states
    inits = write_inits(
        GameInitConfig(game=game, num_train=n_train, num_val=args.val_states, seed=0),
        work / "inits",
        progress=False,
    )
    train_states = load_inits(inits["train"])
    model = str(init_tiny(work / "tiny")) if args.model == "tiny" else resolve_model(args.model)
    curve: list[dict] = []

    names = "random names" if args.random_names else "fixed names"
    title = f"self-play GRPO, matching k={args.k} ({names}), {args.model} model"

    def report(row: dict) -> None:
        """Print the row; rewrite learning.json and the plot (a stopped run keeps its curve)."""
        curve.append(row)
        (work / "learning.json").write_text(json.dumps({"args": vars(args), "curve": curve}))
        plot(curve, work / "learning.png", title)
        greedy = (
            f" (greedy {row['greedy_reward']:.3f} ± {row['greedy_reward_se']:.3f})"
            if args.greedy
            else ""
        )
        print(
            f"iter {row['iteration']}: val {row['reward']:.3f} ± {row['reward_se']:.3f}{greedy}"
            f"  agreement {row['agreement']:.2f}  "
            f"invalid {row['invalid']:.2f}  rollout {row.get('rollout_reward', float('nan')):.3f}  "
            f"zero-std groups {row.get('zero_std_groups', float('nan')):.2f}  clipfrac "
            f"{row.get('clipfrac', float('nan')):.3f}  ppo_kl {row.get('ppo_kl', float('nan')):.4f}  "
            f"({time.perf_counter() - t_start:.0f} s)",
            flush=True,
        )

    warm = bool(args.warm_model or args.sft_states)
    # the current policy: evaluated, then played
    backend = HFBackend(model, args.device, args.batch_size)
    if warm and args.model != "tiny" and args.zero_shot:  # the base model, before the warm start
        zero_shot = val_metrics(backend, inits["val"], *evals, args.zero_shot_states)
        report({"iteration": -1, **zero_shot})
    if warm:  # 2. the warm start
        model = args.warm_model or warm_start(
            model, train_states[: args.sft_states], game, args, work
        )
        backend = HFBackend(model, args.device, args.batch_size)
    report({"iteration": 0, **val_metrics(backend, inits["val"], *evals)})
    # 3. self-play -> GRPO -> eval
    tcfg = GRPOConfig(
        group_key=args.group_key,
        lr=args.lr,
        epochs=args.epochs,
        mini_batch_size=args.mini_batch,
        micro_batch_size=args.micro_batch,
        kl_coef=args.kl_coef,
        loss_agg_mode=args.loss_agg_mode,
        **trainer_options(args),
    )
    shaped = {**rules, "invalid_penalty": args.invalid_penalty}  # eval stays unshaped
    for it in range(1, args.iterations + 1):
        rcfg = RolloutConfig(
            game=GameSpec(name="matching", params=shaped),
            games_per_init=args.games_per_init,
            sampling=sampling.model_copy(update={"seed": 1000 + it}),
            max_live_games=args.max_live_games,
        )
        states = recipe.rotate(train_states[args.sft_states :], it - 1, args.train_states)
        played = recipe.self_play(states, {"policy": backend}, rcfg, work / f"iter-{it}/rollout")
        row = {"iteration": it, "rollout_reward": played.metrics["rollout/normalized_reward"]}
        update = recipe.grpo_step(
            model,
            played.paths["samples"],
            work / f"iter-{it}" / "model",
            tcfg.model_copy(update={"seed": it}),
        )
        model, m = str(update.out_dir), update.metrics
        if not m["train/no_signal"]:
            row |= {
                "zero_std_groups": m[f"train/{args.group_key}/frac_reward_zero_std"],
                "clipfrac": m["train/pg_clipfrac"],
                "ppo_kl": m["train/ppo_kl"],
                "grad_norm": m["train/grad_norm"],
                "entropy": m.get("train/entropy", float("nan")),
            }
        backend = HFBackend(model, args.device, args.batch_size)
        report(row | val_metrics(backend, inits["val"], *evals))
    print(f"curve and plot: {work / 'learning.json'}, {work / 'learning.png'}")
    start = next(row for row in curve if row["iteration"] == 0)  # where GRPO began
    gain, se = paired_gain(start, curve[-1])
    print(f"gain {gain:+.3f} ± {se:.3f} (paired s.e. over {len(start['rewards'])} val states)")
    name = "learning_gain" if args.model == "tiny" else "real_learning_gain"
    print(f"RESULT {name} {gain:.3f}")


if __name__ == "__main__":
    main()
