"""Seed 001's cross-country transfer: does `train.transfer_weight` (pulling together the mean
prompt hidden states of Austria-Italy, England-Russia, France-Germany) help the weaker power of
each pair? The product's loop, per arm (a transfer weight) and training seed.

    .venv/bin/python bench/transfer_ablation.py               # configs/diplomacy.yaml, 0 vs 0.1
    .venv/bin/python bench/transfer_ablation.py --weights 0 0.1 1 --seeds 0 1 2 --jobs 9 \\
        --set device=cuda      # every run at once, on one GPU
    .venv/bin/python bench/transfer_ablation.py --set iterations=1 --set game_init.num_val=1 \\
        --set games_per_iteration=4 --seeds 0 --weights 0 1   # smoke size

1. the config's warm start runs once (`sparring.loop.tasks`), so every arm starts from the same
   checkpoint, and is evaluated: its reward per country against greedy picks the weaker power
   of each of the game's `transfer_pairs`
2. per training seed and weight, `sparring.loop.runner.run_loop` from that checkpoint with
   `train.transfer_weight` = the weight (the game's default pairs), files in `--out`, nothing
   tracked; one by one in this process, or up to `--jobs` at a time in spawned processes,
   each printed as it ends. A training seed moves the rollout's sampling seed (by 1000) and
   the GRPO seed; states and evaluation draws are the same for every arm
3. per run, each country's reward in every final-evaluation game against `eval.opponent`
   (greedy; the learner in that country, the bot in the other six) and its mean centers there
   (`eval/vs_scripted/<COUNTRY>/centers`)
4. per weight > 0 and weaker power: the gain over weight 0 in each seed, its mean over seeds
   and their standard error; writes transfer_ablation.json and ends with
   `RESULT transfer_weaker_gain <the weaker powers' mean gain at the largest weight>`
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import tempfile
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import numpy as np
from grouping_ablation import local, shared_warm_start, summary  # bench/, next to this file

from sparring.cli.options import load_config, parse_params
from sparring.loop.config import CONFIG_DIR, PipelineConfig
from sparring.loop.runner import run_loop


def per_country(cfg: PipelineConfig, eval_dir: Path) -> dict[str, dict]:
    """Per country: the learner's rewards in the evaluation's games against
    `cfg.eval.opponent` (game ids `<init>/<bot>/<country>#<play>`) and its mean centers."""
    games = json.loads((eval_dir / "rewards.json").read_text())["vs_scripted"]
    metrics = json.loads((eval_dir / "metrics.json").read_text())
    roles, out = cfg.game.cls.roles, {}
    for game in games:
        _, bot, country = game["game_id"].split("#")[0].rsplit("/", 2)
        if bot == cfg.eval.opponent:
            out.setdefault(country, []).append(game["rewards"][roles.index(country)])
    return {
        c: {"rewards": r, "centers": metrics.get(f"eval/vs_scripted/{c}/centers", float("nan"))}
        for c, r in out.items()
    }


def one_run(base: PipelineConfig, out: Path, warm: Path, seed: int, weight: float) -> dict:
    """One arm and seed through the loop; its final evaluation per country."""
    name = f"w{weight:g}-seed-{seed}"
    seeded = {"train.seed": seed, "rollout.sampling.seed": 1000 * seed}
    cfg = local(base, out, run_name=name, model=str(warm), warm_start=None, **seeded,
                **{"train.transfer_weight": weight})  # fmt: skip
    its = run_loop(cfg, out / name).iterations
    train = {k: its[-1].metrics.get(f"train/{k}") for k in ("transfer_loss", "transfer_share")}
    eval_dir = out / name / str(its[-1].iteration) / "eval"
    return {"seed": seed, "weight": weight, "countries": per_country(cfg, eval_dir), **train}


def all_runs(jobs: int, calls: list[tuple]) -> Iterator[dict]:
    """`one_run(*call)` for each call, yielded as it ends: one by one in this process with
    `jobs` 1 (no second start-up), else up to `jobs` at a time in spawned processes (CUDA, if
    the warm start used it, can't fork)."""
    if jobs == 1:
        yield from (one_run(*call) for call in calls)
        return
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(jobs, mp_context=spawn) as pool:
        yield from (f.result() for f in as_completed([pool.submit(one_run, *c) for c in calls]))


def gains(runs: list[dict], weaker: list[str], weight: float) -> dict[str, dict]:
    """Per weaker power: (weight's reward - weight 0's) in each seed, mean and s.e. over seeds."""
    by = {(r["weight"], r["seed"]): r["countries"] for r in runs}
    seeds = sorted({s for w, s in by if w == weight and (0.0, s) in by})
    out = {}
    for c in weaker:
        d = [
            np.mean(by[weight, s][c]["rewards"]) - np.mean(by[0.0, s][c]["rewards"]) for s in seeds
        ]
        se = float(np.std(d, ddof=1) / np.sqrt(len(d))) if len(d) > 1 else float("nan")
        out[c] = {"per_seed": [float(x) for x in d], "mean": float(np.mean(d)), "se": se}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--config", default=str(CONFIG_DIR / "diplomacy.yaml"))
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a config field (dotted path, YAML value); repeatable")  # fmt: skip
    ap.add_argument("--weights", type=float, nargs="+", default=[0.0, 0.1], help="the arms")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1], help="training seeds")
    ap.add_argument("--jobs", type=int, default=1, help="runs at a time")
    ap.add_argument("--out", help="work folder (default: a temp folder)")
    args = ap.parse_args()
    if 0.0 not in args.weights or len(args.weights) < 2:
        ap.error("--weights must include 0 (the baseline) and a weight > 0")

    base = load_config(PipelineConfig, args.config, parse_params(tuple(args.set)))
    out = Path(args.out or tempfile.mkdtemp(prefix="sparring-transfer-"))
    # 1. the shared warm start, evaluated: it names the weaker power of each pair
    cfg, warm, warm_eval = shared_warm_start(base, out)
    start = per_country(cfg, warm_eval)
    reward = {c: float(np.mean(v["rewards"])) for c, v in start.items()}
    weaker = [min(pair, key=reward.__getitem__) for pair in cfg.game.cls.transfer_pairs]
    # 2. every arm and seed from that checkpoint; 3. its final evaluation per country
    print(json.dumps({"start": reward, "weaker": weaker}), flush=True)
    grid = [(s, w) for s in args.seeds for w in args.weights]
    runs = []
    for run in all_runs(args.jobs, [(base, out, warm, s, w) for s, w in grid]):
        runs.append(run)
        brief = {
            c: [round(float(np.mean(v["rewards"])), 4), v["centers"]]
            for c, v in run["countries"].items()
        }
        row = {k: v for k, v in run.items() if k != "countries"}
        print(json.dumps(row | {"reward_centers": brief}), flush=True)
    runs.sort(key=lambda r: grid.index((r["seed"], r["weight"])))
    # 4. the report: per country and weight, pooled over seeds; the weaker powers' gains
    print(f"{'country':8s} {'weight':>6s} {'reward vs greedy':>18s} {'centers':>8s} per seed")
    for c in cfg.game.cls.roles:
        print(f"{c:8s} {'start':>6s} {summary(start[c]['rewards'])['mean']:18.4f} "
              f"{start[c]['centers']:8.2f}")  # fmt: skip
        for w in args.weights:
            mine = [r["countries"][c] for r in runs if r["weight"] == w]
            pooled = summary([x for m in mine for x in m["rewards"]])
            seeds = " ".join(f"{np.mean(m['rewards']):.4f}" for m in mine)
            print(f"{'':8s} {w:6g} {pooled['mean']:9.4f} ± {pooled['se']:.4f} "
                  f"{np.mean([m['centers'] for m in mine]):8.2f} {seeds}")  # fmt: skip
    top = max(args.weights)
    effect = {w: gains(runs, weaker, w) for w in args.weights if w > 0}
    for w, g in effect.items():
        for c, v in g.items():
            print(f"weaker {c} at weight {w:g}: {v['mean']:+.4f} ± {v['se']:.4f} over seeds")
    saved = {"config": args.config, "set": args.set, "weaker": weaker, "start": start}
    saved |= {"runs": runs, "gains": {str(w): g for w, g in effect.items()}}
    (out / "transfer_ablation.json").write_text(json.dumps(saved, indent=1))
    print(f"results in {out}")
    print(f"RESULT transfer_weaker_gain {np.mean([v['mean'] for v in effect[top].values()]):.4f}")


if __name__ == "__main__":
    main()
