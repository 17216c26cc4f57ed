"""Does self-play GRPO improve a policy? The product's loop on a shipped recipe, per training seed.

    .venv/bin/python bench/learning.py                      # configs/pipeline.yaml (make run)
    .venv/bin/python bench/learning.py --config configs/pipeline-smollm2.yaml --seeds 0 1
    python bench/learning.py --config configs/pipeline-smollm2.yaml --set device=auto \\
        --set games_per_iteration=256 --set rollout.max_batch_size=256   # on one GPU
    .venv/bin/python bench/learning.py --set iterations=1 --set games_per_iteration=8 \\
        --set game_init.num_val=4 --set warm_start.num_states=8   # smoke size

Each training seed runs `sparring.loop.runner.run_loop`, the loop `sparring run` runs, on the
config with `--set` overrides and the training seed (`sparring.loop.replicates.seeded`: the
rollout's sampling seed moves by 1000 per seed, GRPO and SFT take the seed; the states and the
evaluation's draws stay the same, so the gains of two seeds are comparable), plus what a
measurement needs: the start model (after the warm start) is evaluated before any update
(`evaluate_start`), files stay in `--out` (no S3) and nothing is tracked (no MLflow). Prints
each evaluation as it finishes, writes learning.json and learning.png; with test states
(`game_init.num_test`) it prints the test figures per seed with their mean and standard error
across seeds beside the evaluation's (`sparring run --seeds` prints the same table). Ends with
`RESULT learning_gain <mean over seeds of the paired gain>`: each val game's champion metric
at the last iteration minus at the start, paired game by game (learning.json keeps every
game's).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np

from sparring.cli.options import load_config, parse_params
from sparring.loop.config import DEFAULT_CONFIG, PipelineConfig
from sparring.loop.replicates import Replicate, format_replicates, seeded, summarize
from sparring.loop.runner import Iteration, run_loop
from sparring.stats import paired_gain

# What a row prints beside the champion metric (those present).
SHOWN = ("rollout/normalized_reward", "train/pg_clipfrac", "train/ppo_kl", "train/no_signal")


def measured(base: PipelineConfig, seed: int, out: Path) -> PipelineConfig:
    """`base` for training seed `seed`, measured: start evaluated, local files, no tracking."""
    update = {"run_name": f"seed-{seed}", "evaluate_start": True}
    update["storage"] = base.storage.model_copy(update={"root": str(out / "store")})
    update["tracking"] = base.tracking.model_copy(update={"enabled": False})
    return seeded(base, seed).model_copy(update=update)


def row(seed: int, it: Iteration, metric: str) -> dict:
    """One evaluation, as learning.json keeps it."""
    shown = {k: it.metrics[k] for k in SHOWN if k in it.metrics}
    row = {"seed": seed, "iteration": it.iteration, "reward": it.metrics[metric], **shown}
    return row | {"val_scores": it.val_scores}  # a cut-off run's paired gain comes from these


def plot(curves: dict[int, list[dict]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    for seed, curve in curves.items():
        ax.plot(
            [r["iteration"] for r in curve],
            [r["reward"] for r in curve],
            "o-",
            label=f"seed {seed}",
        )
    ax.set_xlabel("iteration (the first point: the start, before any update)")
    ax.set_ylabel("val reward")
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--config", default=str(DEFAULT_CONFIG), help="a pipeline config (YAML)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a config field (dotted path, YAML value); repeatable")  # fmt: skip
    ap.add_argument("--seeds", type=int, nargs="+", default=[0], help="training seeds")
    ap.add_argument("--out", help="work folder (default: a temp folder)")
    args = ap.parse_args()

    base = load_config(PipelineConfig, args.config, parse_params(tuple(args.set)))
    out = Path(args.out or tempfile.mkdtemp(prefix="sparring-learning-"))
    metric, curves, gains, replicates = base.champion_metric, {}, {}, []
    title = f"{base.name}: {metric}"
    for seed in args.seeds:
        curve = curves.setdefault(seed, [])

        def report(it: Iteration, seed: int = seed, curve: list = curve) -> None:
            curve.append(row(seed, it, metric))
            print(json.dumps({k: v for k, v in curve[-1].items() if k != "val_scores"}), flush=True)
            (out / "learning.json").write_text(
                json.dumps({"config": args.config, "curves": curves})
            )

        cfg = measured(base, seed, out)
        result = run_loop(cfg, out / f"seed-{seed}", on_iteration=report)
        gains[seed] = paired_gain(result.start.val_scores, result.iterations[-1].val_scores)
        print(f"seed {seed}: gain {gains[seed][0]:+.3f} ± {gains[seed][1]:.3f} (paired s.e.)")
        if result.test:
            replicates.append(Replicate(seed, cfg.run_name, result.test))
    summary = {"gains": gains, "curves": curves, "config": args.config, "set": args.set}
    if replicates:
        summary["test"] = summarize(replicates)
        print(format_replicates(summary["test"], metric))
    (out / "learning.json").write_text(json.dumps(summary))
    plot(curves, out / "learning.png", title)
    values = [g for g, _ in gains.values()]
    spread = (
        f" ± {np.std(values, ddof=1):.3f} (s.d. over {len(values)} seeds)"
        if len(values) > 1
        else ""
    )
    print(f"gain {np.mean(values):+.3f}{spread}; curve and plot in {out}")
    print(f"RESULT learning_gain {np.mean(values):.3f}")


if __name__ == "__main__":
    main()
