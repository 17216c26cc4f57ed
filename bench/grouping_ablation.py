"""Seed 001's open question at CPU scale: does grouping GRPO advantages by country beat
grouping by initial state (standard per-prompt grouping) or one batch-wide group?

    .venv/bin/python bench/grouping_ablation.py                 # about 20 minutes on 2 cores
    .venv/bin/python bench/grouping_ablation.py --selfplay --train 8 --seeds 1   # self-play
    .venv/bin/python bench/grouping_ablation.py --iters 1 --train 7 --val 1 --warm 1 \\
        --warm-epochs 1 --seeds 1 --eval-samples 1              # smoke
    python bench/grouping_ablation.py --model smollm2-135m-instruct --device cuda \\
        --lora-rank 16 --warm-lr 1e-3 --warm-epochs 1 --lr 2e-4   # a real model, on a GPU

Steps:
  1. a model (`--model`: the tiny one, built here, or any model ref such as
     smollm2-135m-instruct), warm-started by SFT on greedy-bot self-play (so it writes orders)
  2. for each training seed and each group key (country, init, batch), from that same
     checkpoint with the same seeds: `iters` rounds of rollout -> GRPO update
     (`seq-mean-token-mean` loss by default). Each rollout seats the learner in one country
     per game against greedy bots (`sparring.opponents.plan_seats`, countries balanced), or
     with `--selfplay` in all seven (the non-stationary case seed 001 is about: the opponents
     are the learner itself), and plays each initial state `games_per_init` times, so an
     `init` group is "same state, same seat" and a `country` group spans all states of that
     country.
  3. evaluate every final checkpoint against the greedy bot, learner in each country in turn
     (`sparring.evaluate_diplomacy.vs_bots`), on held-out states, `eval_samples` sampled games
     (temperature 1, seeded) per state and country: the expected reward moves with small
     policy changes that greedy orders hide
  4. print mean reward with its standard error (over all eval games of all seeds) per key,
     and each seed's mean, plot them, and end with
     `RESULT country_vs_init_gain <country - init final eval reward>`
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np

from sparring import recipe
from sparring.evaluate import EvalConfig
from sparring.game_init import GameInitConfig, generate_inits
from sparring.games import GameSpec
from sparring.games.diplomacy import ROLES, DiplomacyGame
from sparring.games.diplomacy.report import vs_bots
from sparring.generation.base import SamplingParams
from sparring.generation.hf import HFBackend
from sparring.models import resolve_model
from sparring.opponents import DifficultyConfig, DifficultySchedule, plan_seats
from sparring.rollout import RolloutConfig
from sparring.sft import SFTConfig
from sparring.tiny_model import init_tiny
from sparring.train import GRPOConfig

KEYS = ("country", "init", "batch")


def inits_of(split: str, n: int, params: dict, seed: int) -> list[tuple[str, dict]]:
    cfg = GameInitConfig(
        game=GameSpec(name="diplomacy", params=params),
        seed=seed,
        num_train=n if split == "train" else 0,
        num_val=n if split == "val" else 0,
    )
    return [(r.init_id, json.loads(r.state)) for r in generate_inits(cfg, False).itertuples()]


def trainer_options(args) -> dict:
    """Device, LoRA and batch sizes shared by the warm start's SFT and every GRPO update."""
    return {
        "device": args.device,
        "lora_rank": args.lora_rank,
        "mini_batch_size": 16,
        "micro_batch_size": 8,
    }


def warm_start(work: Path, params: dict, args) -> Path:
    """1. SFT the model (`--model`; tiny: a fresh one) on greedy bots playing every seat."""
    model = init_tiny(work / "tiny") if args.model == "tiny" else resolve_model(args.model)
    rcfg = RolloutConfig(game=GameSpec(name="diplomacy", params=params))
    sft_cfg = SFTConfig(lr=args.warm_lr, epochs=args.warm_epochs, **trainer_options(args))
    states = inits_of("train", args.warm, params, seed=1)
    return recipe.warm_start(model, rcfg, "greedy", states, work / "warm", sft_cfg).out_dir


def run_key(key: str, seed: int, warm: Path, work: Path, args, params: dict, train_inits) -> Path:
    """2. `iters` rounds of rollout + GRPO with one group key; returns the final checkpoint."""
    model, out = warm, work / f"seed-{seed}" / key
    plan, _ = plan_seats(
        len(train_inits),
        ROLES,
        DifficultySchedule(DifficultyConfig(pool=["greedy"])),
        selfplay_fraction=1.0 if args.selfplay else 0.0,
        seed=seed,
    )
    for it in range(args.iters):
        sampling = SamplingParams(
            temperature=1.0, max_new_tokens=args.max_new_tokens, seed=seed * 1000 + it
        )
        rcfg = RolloutConfig(
            game=GameSpec(name="diplomacy", params=params),
            games_per_init=args.games_per_init,
            sampling=sampling,
        )
        policies = {
            "policy": HFBackend(str(model), device=args.device),
            "greedy": DiplomacyGame.make_agent("greedy"),
        }
        played = recipe.self_play(train_inits, policies, rcfg, out / f"rollout-{it}", plan)
        tcfg = GRPOConfig(
            group_key=key,
            lr=args.lr,
            loss_agg_mode=args.loss_agg_mode,
            seed=seed * 1000 + it,
            **trainer_options(args),
        )
        update = recipe.grpo_step(model, played.paths["samples"], out / f"iter-{it}", tcfg)
        model = update.out_dir
        reward = played.metrics["rollout/normalized_reward"]
        print(f"  seed {seed} {key} iter {it}: rollout reward {reward:.3f}", flush=True)
    return model


def evaluate_vs_greedy(model: Path, val_inits, params: dict, args) -> np.ndarray:
    """3. The learner's reward in every (val state, country, sample) game against greedy."""
    sampling = SamplingParams(
        temperature=args.eval_temperature, max_new_tokens=args.max_new_tokens, seed=0
    )
    rcfg = RolloutConfig(
        game=GameSpec(name="diplomacy", params=params), sampling=sampling, max_batch_size=256
    )
    cfg = EvalConfig(rollout=rcfg)
    plays = [
        (f"{init_id}~{k}", state) for init_id, state in val_inits for k in range(args.eval_samples)
    ]
    _, eps = vs_bots(HFBackend(str(model), device=args.device), plays, cfg, False, ["greedy"])
    return np.array([e.rewards[e.seat_policies.index("policy")] for e in eps])


def plot(results: dict[str, np.ndarray], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results)
    means = [results[k].mean() for k in names]
    ses = [results[k].std(ddof=1) / np.sqrt(len(results[k])) for k in names]
    fig, ax = plt.subplots(figsize=(4.5, 3.5))
    ax.bar(names, means, yerr=ses, capsize=5, color="tab:blue")
    ax.set_ylabel("eval reward vs greedy (± s.e.)")
    ax.set_xlabel("GRPO group key")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", default="tiny", help="tiny, or a model ref: named, hub, path")
    ap.add_argument("--device", default="cpu", help="cpu, cuda or auto")
    ap.add_argument("--lora-rank", type=int, default=0, help="> 0: train LoRA adapters only")
    ap.add_argument("--iters", type=int, default=4, help="rollout + update rounds per key")
    ap.add_argument("--seeds", type=int, default=2, help="training runs per key (seeds 0..n-1)")
    ap.add_argument("--train", type=int, default=28, help="train states per round")
    ap.add_argument("--games-per-init", type=int, default=4)
    ap.add_argument("--val", type=int, default=8, help="val states (x 7 countries in eval)")
    ap.add_argument("--eval-samples", type=int, default=4, help="plays per val state and country")
    ap.add_argument("--eval-temperature", type=float, default=1.0, help="0 = greedy eval")
    ap.add_argument("--loss-agg-mode", default="seq-mean-token-mean")
    ap.add_argument(
        "--selfplay",
        action="store_true",
        help="train in pure self-play (the learner in all 7 seats) instead of vs greedy",
    )
    ap.add_argument("--warm", type=int, default=16, help="greedy self-play games for SFT")
    ap.add_argument("--warm-epochs", type=int, default=3)
    ap.add_argument("--warm-lr", type=float, default=3e-3, help="the warm start's SFT lr")
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--out", type=Path, help="work dir (default: a temp dir)")
    args = ap.parse_args()

    work = args.out or Path(tempfile.mkdtemp(prefix="sparring-ablation-"))
    params = {"horizon": 1, "press": False, "stages": ["opening"]}  # one game year
    warm = warm_start(work, params, args)
    train_inits = inits_of("train", args.train, params, seed=2)
    val_inits = inits_of("val", args.val, params, seed=2)
    results = {"warm start": evaluate_vs_greedy(warm, val_inits, params, args)}
    per_seed: dict[str, list[float]] = {key: [] for key in KEYS}
    for seed in range(args.seeds):
        for key in KEYS:
            final = run_key(key, seed, warm, work, args, params, train_inits)
            rewards = evaluate_vs_greedy(final, val_inits, params, args)
            results[key] = np.concatenate([results.get(key, []), rewards])
            per_seed[key].append(float(rewards.mean()))
            print(f"  seed {seed} {key}: eval reward vs greedy {rewards.mean():.4f}", flush=True)
    for name, r in results.items():
        se = r.std(ddof=1) / np.sqrt(len(r)) if len(r) > 1 else 0.0
        seeds = " ".join(f"{m:.4f}" for m in per_seed.get(name, []))
        print(
            f"{name:10s} eval reward vs greedy {r.mean():.4f} ± {se:.4f} (n={len(r)})"
            + (f"  per seed: {seeds}" if seeds else "")
        )
    plot(results, work / "grouping_ablation.png")
    print(f"plot: {work / 'grouping_ablation.png'}")
    print(f"RESULT country_vs_init_gain {results['country'].mean() - results['init'].mean():.4f}")


if __name__ == "__main__":
    main()
