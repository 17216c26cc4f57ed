"""Does self-play GRPO improve a policy? The product's loop on a shipped recipe, per training seed.

    .venv/bin/python bench/learning.py                      # configs/pipeline.yaml (make run)
    .venv/bin/python bench/learning.py --config configs/pipeline-smollm2.yaml --seeds 0 1
    python bench/learning.py --config configs/pipeline-smollm2.yaml --set device=auto \\
        --set games_per_iteration=256 --set rollout.max_batch_size=256   # on one GPU
    .venv/bin/python bench/learning.py --set iterations=1 --set games_per_iteration=8 \\
        --set game_init.num_val=4 --set warm_start.num_states=8   # smoke size
    .venv/bin/python bench/learning.py --control sft --seeds 0 1 2   # against the SFT control
    .venv/bin/python bench/learning.py --seeds 0 1 2 --arm carry train.optimizer_state=carry
    .venv/bin/python bench/learning.py --merge /tmp/l0 /tmp/l1 /tmp/l2 --out /tmp/all

Each training seed runs `sparring.loop.runner.run_loop`, the loop `sparring run` runs, on the
config with `--set` overrides and the training seed (`sparring.loop.replicates.seeded`: the
rollout's sampling seed moves by 1000 per seed, GRPO and SFT take the seed; the states and the
evaluation's draws stay the same, so the gains of two seeds are comparable), plus what a
measurement needs: the start model (after the warm start) is evaluated before any update
(`evaluate_start`), files stay in `--out` (no S3) and nothing is tracked (no MLflow). Prints
each evaluation as it finishes (with each task's peak memory, `perf/<task>_peak_rss_gib`),
writes learning.json and learning.png (with the game's baselines on the val states); with test
states (`game_init.num_test`) it writes transcripts.md (the val games the start's and the last
evaluation kept, for the best and the worst seed by test gain), and prints the test figures per
seed with their mean and standard error across seeds beside the evaluation's
(`sparring run --seeds` prints the same table). Prints `RESULT learning_gain <mean over seeds
of the paired gain>`: each val game's champion metric at the last iteration minus at the
start, paired game by game (learning.json keeps every game's); with test states then
`RESULT real_test_reward`, `real_gain_over_warm_start` and `real_gain_over_best_trivial` (the
final model on test, its gain over the start, its margin over the best trivial baseline on
the same states), each the mean over seeds with a `_se_seeds` twin.

`--control sft` runs each seed a second time as the SFT control (`sparring.loop.control`):
the same warm start, then in place of each GRPO iteration an SFT round on the teacher's
games of that iteration's train states, with as many optimizer steps as the GRPO update took
(`--control-budget wall`: as many as fit in the seconds its rollout and update took), at the
warm start's learning rate (`--control-lr` sets another), evaluated on the same val and test
states with the same draws. It prints both arms side by
side per seed (test start, final and gain of each, GRPO minus the control paired over the
test games), their mean and s.e. across seeds, and ends with
`RESULT real_gain_over_sft_control <mean over seeds of GRPO's final test score minus the
control's>` and `RESULT real_gain_over_sft_control_se_seeds <its s.e. across seeds>`.

`--arm NAME KEY=VALUE...` (repeatable) runs each seed again per arm with those overrides, from
the seed's warm-started model (the arm's `warm_start` is dropped, so the recipe and its arms
share one start), and compares each arm's final model with the recipe's on the test games,
paired, per seed and across seeds: `RESULT arm_<NAME>_minus_recipe <mean over seeds>` and
`RESULT arm_<NAME>_minus_recipe_se_seeds <its s.e. across seeds>`.

`--t1-arm` adds the arm `t1`: the update as it was before the temperature fix (d20a0e8), the
trainer scoring every row's log-probs, entropy and KL at temperature 1 whatever temperature
the row was sampled at (`train/mismatch_kl` then shows the bias). It is the fix's
before-and-after figure, from the same warm start and seeds.

`--merge DIR...` runs nothing: it reads the `--out` folders of earlier invocations (say one
process per seed, run side by side on one GPU) and prints and writes the report one
invocation with all their seeds would have, from each run that got as far as it needs: the
val curves as played, a run's test figures and comparisons where it reached its test step. A
config that sets `sft_control` is run as the SFT control alone (folder `seed-S-sft`), so a
control can run beside its recipe and be merged with it.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from unittest import mock

import click
import numpy as np
import torch

import sparring.train
from sparring.cli.options import load_config, parse_params
from sparring.loop.config import CONFIG_DIR, DEFAULT_CONFIG, PipelineConfig
from sparring.loop.control import compare, control_config, final_difference, format_comparison
from sparring.loop.replicates import TRIVIAL, Replicate, format_replicates, seeded, summarize
from sparring.loop.runner import Iteration, LoopResult, run_loop
from sparring.loop.tasks import PEAK_METRICS
from sparring.stats import mean_se, paired_gain

# What a row prints beside the champion metric (those present).
SHOWN = (
    "rollout/normalized_reward",
    "rollout/invalid_rate",
    "train/pg_clipfrac",
    "train/ppo_kl",
    "train/no_signal",
    "train/optimizer_steps",
    "train/mismatch_kl",
    *PEAK_METRICS,  # each task's peak memory (GiB): where a run's memory goes, by phase
)
T1 = "t1"  # --t1-arm's name
# The test figures' RESULT lines (each with a `_se_seeds` twin): the final model's reward, its
# gain over the start (the warm-started model), and its margin over the best trivial baseline.
RESULTS_ON_TEST = (
    ("real_test_reward", "test/final"),
    ("real_gain_over_warm_start", "test/gain"),
    ("real_gain_over_best_trivial", TRIVIAL),
)
BASELINE = "eval/baseline/"  # the game's baselines on the same val states (sparring.evaluate)


def measured(base: PipelineConfig, seed: int, out: Path) -> PipelineConfig:
    """`base` for training seed `seed`, measured: start evaluated, local files, no tracking."""
    update = {"run_name": f"seed-{seed}", "evaluate_start": True}
    update["storage"] = base.storage.model_copy(update={"root": str(out / "store")})
    update["tracking"] = base.tracking.model_copy(update={"enabled": False})
    return seeded(base, seed).model_copy(update=update)


def saved_config(saved: dict) -> PipelineConfig:
    """The config a bench's saved report names (`config`, `set`); a shipped config written on
    another machine is found by its name here."""
    path = Path(saved["config"])
    path = path if path.exists() else CONFIG_DIR / path.name
    return load_config(PipelineConfig, str(path), parse_params(tuple(saved.get("set", []))))


def row(seed: int, it: Iteration, metric: str) -> dict:
    """One evaluation, as learning.json keeps it."""
    shown = {k: it.metrics[k] for k in SHOWN if k in it.metrics}
    row = {"seed": seed, "iteration": it.iteration, "reward": it.metrics[metric], **shown}
    baselines = {
        k.removeprefix(BASELINE): v
        for k, v in it.metrics.items()
        if k.startswith(BASELINE) and not k.endswith("_se")
    }
    # a cut-off run's paired gain comes from val_scores
    return row | {"baselines": baselines, "val_scores": it.val_scores}


@contextmanager
def saved_figure(
    path: Path, title: str, size: tuple[float, float] = (6.5, 3.8), rows: int | None = None
) -> Iterator:
    """Axes to draw on (given `rows`, a list of that many, stacked, sharing x); on exit the figure
    is titled above its first axes, saved to `path` and closed (the benches' plots: this
    one's, bench/kuhn.py's and bench/grouping_ablation.py's)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(rows or 1, 1, figsize=size, sharex=True, squeeze=False)
    yield list(ax[:, 0]) if rows else ax[0, 0]
    ax[0, 0].set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot(arms: dict[str, dict[int, list[dict]]], path: Path, title: str):
    """Per arm (the recipe first, then the SFT control and the other arms) one thin line per
    seed and, with several seeds, their mean with its standard error across seeds; the game's
    baselines on the same val states as dashed grey lines."""
    with saved_figure(path, title) as ax:
        first = next((r for c in arms.values() for cv in c.values() for r in cv), {})
        levels: dict[float, list[str]] = {}  # baselines that score alike share a line
        for name, value in first.get("baselines", {}).items():
            levels.setdefault(round(value, 3), []).append(name)
        for value, names in levels.items():
            ax.axhline(value, ls="--", lw=0.8, color="grey")
            ax.annotate(" = ".join(names), (1, value), xycoords=("axes fraction", "data"),
                        fontsize=7, color="grey", ha="right", va="bottom")  # fmt: skip
        for i, (arm, curves) in enumerate(arms.items()):
            color = f"C{i}"
            for seed, curve in curves.items():
                x, y = [r["iteration"] for r in curve], [r["reward"] for r in curve]
                alone = len(curves) == 1
                label = f"{arm}, seed {seed}" if alone else None
                ax.plot(x, y, "o-", color=color, alpha=1 if alone else 0.25, lw=1, label=label)
            if len(curves) > 1:
                by_iteration: dict[int, list[float]] = {}
                for curve in curves.values():
                    for r in curve:
                        by_iteration.setdefault(r["iteration"], []).append(r["reward"])
                x = sorted(by_iteration)
                mean, se = zip(*(mean_se(by_iteration[i]) for i in x), strict=True)
                label = f"{arm}, mean of {len(curves)} seeds ± s.e."
                ax.errorbar(x, mean, yerr=se, fmt="o-", color=color, lw=2, capsize=3, label=label)
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.set_xlabel("iteration (the first point: the start, before any update)")
        ax.set_ylabel("val reward")
        ax.legend(fontsize=8)


@contextmanager
def scored_at_t1() -> Iterator[None]:
    """The trainer as before the temperature fix (d20a0e8): every row scored at temperature 1
    (the fault this arm injects, reverted on exit)."""
    with mock.patch.object(sparring.train, "sampling_temperature", lambda df: torch.ones(len(df))):
        yield


def arm_config(args: argparse.Namespace, base: PipelineConfig, seed: int, name: str,
               sets: list[str], out: Path) -> PipelineConfig:  # fmt: skip
    """Arm `name` of training seed `seed`: the recipe with the arm's overrides, started from the
    seed's warm-started model (no warm start of its own)."""
    start = [f"model={out / f'seed-{seed}' / 'warm'}", "warm_start=null"] if base.warm_start else []
    arm = load_config(PipelineConfig, args.config, parse_params(tuple(args.set + start + sets)))
    return measured(arm, seed, out).model_copy(update={"run_name": f"seed-{seed}-{name}"})


def format_arm(name: str, sets: list[str], versus: dict) -> str:
    """Arm `name`'s final test score minus the recipe's per seed (paired over the test games),
    then their mean and standard error across seeds; for an arm no seed ran to its test step,
    the same on val at the last iteration both runs reached (`versus["split"]`)."""
    split, per_seed = versus["split"], versus["seeds"]
    where = "final model on test" if split == "test" else "last common iteration on val"
    lines = [f"arm {name} ({' '.join(sets)}) minus the recipe, {where}:"]
    if not per_seed:
        return "\n".join([*lines, "  no seed has a finished evaluation of both runs to compare"])
    lines += [f"  seed {seed}: {d:+.3f} ± {se:.3f} (paired)" for seed, (d, se) in per_seed.items()]
    if split != "test":
        lines.append("  (no seed's arm reached its test step: a val figure, not a claim)")
    mean, se = mean_se([d for d, _ in per_seed.values()])
    spread = f"± {se:.3f} (s.e. across seeds)" if len(per_seed) > 1 else "(one seed: no spread)"
    return "\n".join([*lines, f"  mean {mean:+.3f} {spread}"])


def on_val(recipe: list[dict], arm: list[dict]) -> tuple[float, float] | None:
    """The arm's val scores minus the recipe's, paired game by game, at the last iteration
    after an update that both curves reached; None before any update."""
    last = min(len(recipe), len(arm)) - 1
    return paired_gain(recipe[last]["val_scores"], arm[last]["val_scores"]) if last > 0 else None


def tested(run: Path) -> dict[str, float] | None:
    """The test figures of the run in folder `run` (its test step's test/test.json), or None
    where it did not reach its test step."""
    path = run / "test" / "test.json"
    return json.loads(path.read_text())["figures"] if path.exists() else None


def arm_run(where: dict[tuple[str, int], Path], arm: str, seed: int, recipe: Path) -> Path:
    """The run folder of `arm` for `seed`: in its own invocation's folder (`where`), else beside
    the recipe's run `recipe`."""
    return where.get((arm, seed), recipe.parent) / f"seed-{seed}-{arm}"


def gathered(folders: list[Path]) -> dict:
    """The runs of one or several invocations (their `--out` folders: learning.json and the run
    folders) as one summary: every curve, the recipe's val gain per seed, the test figures of
    each recipe run that reached its test step, and the SFT control's and each arm's
    comparison with the recipe on test, where both reached it."""
    saved = [json.loads((f / "learning.json").read_text()) for f in folders]
    summary = {k: saved[0][k] for k in ("config", "set", "metric", "title")}
    summary["arm_sets"] = {k: v for s in saved for k, v in s["arm_sets"].items()}
    arms: dict[str, dict[int, list[dict]]] = {}
    where: dict[tuple[str, int], Path] = {}  # each arm's and seed's folder
    for folder, s in zip(folders, saved, strict=True):
        for arm, curves in s["arms"].items():
            for seed, curve in curves.items():
                arms.setdefault(arm, {})[int(seed)] = curve
                where[arm, int(seed)] = folder
    gains, replicates, versus, runs = {}, [], {}, {}
    arm_versus: dict[str, dict[int, tuple[float, float]]] = {a: {} for a in summary["arm_sets"]}
    arm_on_val: dict[str, dict[int, tuple[float, float]]] = {a: {} for a in summary["arm_sets"]}
    for seed, curve in sorted(arms.get("recipe", {}).items()):
        if len(curve) > 1:  # a run cut before its first update has no gain
            gains[seed] = paired_gain(curve[0]["val_scores"], curve[-1]["val_scores"])
        for name, per_seed in arm_on_val.items():
            if (arm := arms.get(name, {}).get(seed)) and (v := on_val(curve, arm)):
                per_seed[seed] = v
        recipe = where["recipe", seed] / f"seed-{seed}"
        if (figures := tested(recipe)) is None:
            continue
        replicates.append(Replicate(seed, recipe.name, figures))
        runs[seed] = str(recipe)
        if tested(control := arm_run(where, "sft", seed, recipe)) is not None:
            versus[seed] = compare(recipe, control)
        for name, per_seed in arm_versus.items():
            if tested(other := arm_run(where, name, seed, recipe)) is not None:
                per_seed[seed] = final_difference(other, recipe)
    versus_recipe = {  # on test where any seed's arm got there, else on val
        name: {"split": "test", "seeds": per_seed}
        if per_seed
        else {"split": "val", "seeds": arm_on_val[name]}
        for name, per_seed in arm_versus.items()
    }
    summary |= {"arms": arms, "gains": gains, "versus_recipe": versus_recipe, "runs": runs}
    if replicates:
        summary["test"] = summarize(replicates)
    if versus:
        summary["versus_sft_control"] = versus
    return summary


def turn_line(turn: dict) -> str:
    """One reply of a kept transcript on one line, a rejected one with the game's error."""
    text = " | ".join(line.strip() for line in turn["text"].splitlines() if line.strip())
    rejected = "" if turn["ok"] else f" (rejected: {turn['error']})"
    return f"seat {turn['seat']}{rejected}: {text}"


def transcripts(summary: dict) -> str | None:
    """The val games each evaluation kept (its transcripts.json) for the best and the worst
    training seed by test gain, at the start and after the last iteration, as Markdown; None
    without a seed that reached its test step."""
    tested_seeds = summary.get("test", {}).get("seeds", {})
    if not tested_seeds:
        return None
    order = sorted(tested_seeds, key=lambda seed: tested_seeds[seed]["test/gain"])
    picks = [("best", order[-1])] + ([("worst", order[0])] if len(order) > 1 else [])
    lines = [f"# What the model says: {summary['title']}", ""]
    gains = [f"{seed} ({tested_seeds[seed]['test/gain']:+.3f})" for seed in order]
    lines += [f"Training seeds by test gain (final - start): {', '.join(gains)}.", ""]
    for label, seed in picks:
        curve = summary["arms"]["recipe"][seed]
        for row in (curve[0], curve[-1]):
            when = "the start" if row is curve[0] else f"after iteration {row['iteration']}"
            lines += [f"## The {label} seed ({seed}), {when}", ""]
            kept = Path(summary["runs"][seed]) / str(row["iteration"]) / "eval" / "transcripts.json"
            for games in json.loads(kept.read_text()).values():
                for game in games:
                    rewards = ", ".join(f"{r:.2f}" for r in game["rewards"])
                    lines += [f"**{game['game_id']}**, rewards {rewards}", "", "```text"]
                    lines += [*map(turn_line, game["transcript"]), "```", ""]
    return "\n".join(lines)


def report(summary: dict, out: Path) -> None:
    """Print the summary's tables and RESULT lines; write learning.json, learning.png and
    transcripts.md (the best and the worst seed's kept games)."""
    out.mkdir(parents=True, exist_ok=True)
    if "test" in summary:
        print(format_replicates(summary["test"], summary["metric"]))
    if versus := summary.get("versus_sft_control"):
        print(format_comparison(versus, summary["metric"]))
    for name, versus_arm in summary["versus_recipe"].items():
        print(format_arm(name, summary["arm_sets"][name], versus_arm))
    (out / "learning.json").write_text(json.dumps(summary))
    plot(summary["arms"], out / "learning.png", summary["title"])
    if said := transcripts(summary):
        (out / "transcripts.md").write_text(said)
    if not (values := [g for g, _ in summary["gains"].values()]):
        print(
            "no GRPO iteration to report (an SFT control or an arm alone: merge it with its "
            f"recipe's folders; or runs cut before their first update); plot in {out}"
        )
        return
    spread = (
        f" ± {np.std(values, ddof=1):.3f} (s.d. over {len(values)} seeds)"
        if len(values) > 1
        else ""
    )
    print(f"gain {np.mean(values):+.3f}{spread}; curve and plot in {out}")
    print(f"RESULT learning_gain {np.mean(values):.3f}")
    for name, key in RESULTS_ON_TEST:
        if key in summary.get("test", {}).get("mean", {}):
            print(f"RESULT {name} {summary['test']['mean'][key]:.4f}")
            print(f"RESULT {name}_se_seeds {summary['test']['se_seeds'][key]:.4f}")
    if versus:
        diff, se = mean_se([v["grpo_minus_sft"] for v in versus.values()])
        print(f"RESULT real_gain_over_sft_control {diff:.4f}")
        print(f"RESULT real_gain_over_sft_control_se_seeds {se:.4f}")
    for name, versus_arm in summary["versus_recipe"].items():
        if per_seed := versus_arm["seeds"]:
            diff, se = mean_se([d for d, _ in per_seed.values()])
            tag = "" if versus_arm["split"] == "test" else "_on_val"
            print(f"RESULT arm_{name}_minus_recipe{tag} {diff:.4f}")
            print(f"RESULT arm_{name}_minus_recipe{tag}_se_seeds {se:.4f}")


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--config", default=str(DEFAULT_CONFIG), help="a pipeline config (YAML)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a config field (dotted path, YAML value); repeatable")  # fmt: skip
    ap.add_argument("--seeds", type=int, nargs="+", default=[0], help="training seeds")
    ap.add_argument("--out", help="work folder (default: a temp folder)")
    ap.add_argument("--control", choices=["sft"],
                    help="also run each seed as the SFT control and compare on test")  # fmt: skip
    ap.add_argument("--control-budget", choices=["steps", "wall"], default="steps",
                    help="what the control matches per GRPO iteration")  # fmt: skip
    ap.add_argument("--control-lr", type=float, metavar="LR",
                    help="the control's learning rate (default: the warm start's)")  # fmt: skip
    ap.add_argument("--arm", nargs="+", action="append", default=[], metavar=("NAME", "KEY=VALUE"),
                    help="also run each seed with these overrides from its warm start, and "
                    "compare with the recipe on test; repeatable")  # fmt: skip
    ap.add_argument("--t1-arm", action="store_true",
                    help=f"also run each seed as the arm {T1!r}: the trainer scoring log-probs at "
                    "temperature 1, as before the temperature fix")  # fmt: skip
    ap.add_argument("--merge", nargs="+", metavar="DIR",
                    help="run nothing: combine the --out folders of earlier invocations (one per "
                    "seed, run side by side) into one report in --out")  # fmt: skip
    args = ap.parse_args()
    if any(a[0] == T1 for a in args.arm) and args.t1_arm:
        ap.error(f"--arm {T1} clashes with --t1-arm's arm; name it otherwise")
    args.arm += [[T1]] if args.t1_arm else []

    out = Path(args.out or tempfile.mkdtemp(prefix="sparring-learning-"))
    if args.merge:
        report(gathered([Path(f) for f in args.merge]), out)
        return
    try:
        base = load_config(PipelineConfig, args.config, parse_params(tuple(args.set)))
    except click.UsageError as e:
        ap.error(e.format_message())
    for name, *sets in args.arm:  # each arm's settings checked now, not after the recipe's run
        try:
            arm_config(args, base, args.seeds[0], name, sets, out)
        except click.UsageError as e:
            ap.error(f"--arm {name}: {e.format_message()}")
    if args.control and base.sft_control:
        ap.error("--control: the config is already an SFT control (sft_control is set)")
    if (args.control or args.arm) and not base.game_init.num_test:
        ap.error("--control and --arm compare on test states: set game_init.num_test > 0")
    # every run's curve per seed: the recipe's first, then the SFT control's and each arm's
    arms: dict[str, dict[int, list[dict]]] = {"recipe": {}}
    saved = {"config": args.config, "set": args.set, "metric": base.champion_metric}
    saved |= {
        "title": f"{base.name}: {base.champion_metric}",
        "arm_sets": {name: sets for name, *sets in args.arm},
    }

    def run(cfg: PipelineConfig, seed: int, arm: str) -> LoopResult:
        """`run_loop` on `cfg` in `out`, printing each evaluation and keeping it in
        `arms[arm][seed]` and learning.json."""
        curve = arms.setdefault(arm, {}).setdefault(seed, [])

        def on_iteration(it: Iteration) -> None:
            curve.append(row(seed, it, saved["metric"]) | ({} if arm == "recipe" else {"arm": arm}))
            shown = {k: v for k, v in curve[-1].items() if k not in ("val_scores", "baselines")}
            print(json.dumps(shown), flush=True)
            (out / "learning.json").write_text(json.dumps(saved | {"arms": arms}))

        return run_loop(cfg, out / cfg.run_name, on_iteration=on_iteration)

    for seed in args.seeds:
        cfg = measured(base, seed, out)
        if base.sft_control:  # the run is an SFT control: filed as one, for --merge
            run(cfg.model_copy(update={"run_name": f"{cfg.run_name}-sft"}), seed, "sft")
            continue
        result = run(cfg, seed, "recipe")
        gain, se = paired_gain(result.start.val_scores, result.iterations[-1].val_scores)
        print(f"seed {seed}: gain {gain:+.3f} ± {se:.3f} (paired s.e.)")
        if args.control:
            spent = [it.metrics for it in result.iterations]
            control = control_config(cfg, spent, args.control_budget, args.control_lr)
            run(control.model_copy(update={"run_name": f"{cfg.run_name}-sft"}), seed, "sft")
        for name, *sets in args.arm:
            with scored_at_t1() if args.t1_arm and name == T1 else nullcontext():
                run(arm_config(args, base, seed, name, sets, out), seed, name)
    report(gathered([out]), out)


if __name__ == "__main__":
    main()
