"""Does self-play GRPO make a Kuhn Poker policy less exploitable? The product's loop on
configs/kuhn.yaml, per training seed, scored by exact exploitability (open_spiel).

    .venv/bin/python bench/kuhn.py --seeds 0 1 2 --out runs/kuhn          # the tiny model
    .venv/bin/python bench/kuhn.py --set model=smollm2-135m-instruct --seeds 0 --out runs/k
    .venv/bin/python bench/kuhn.py --set iterations=1 --set games_per_iteration=16 \\
        --set game_init.num_val=4 --set warm_start.num_states=8   # smoke size
    .venv/bin/python bench/kuhn.py --seeds 0 --set opponents.selfplay_fraction=0 \\
        --set "opponents.difficulty.pool=[kuhn-poker-exploiter]"   # against a best response

1. each training seed runs `sparring.loop.runner.run_loop` as bench/learning.py does (`measured`:
   the start evaluated before any update, local files, no tracking, the seed moving the
   rollout's sampling and the GRPO and SFT seeds)
2. every evaluation logs `eval/exploitability`: the policy read out of the model at the 12
   information sets of one hand, each legal reply scored teacher-forced at the evaluation's
   temperature and normalised over the legal moves (sparring.games.textarena.exploitability);
   exact for that policy, so its only spread is over training seeds. With a population
   (`--set population.size=K`: members that play each other, not themselves) the iteration's
   figure is its lead's (the best-rated member), and each row keeps every member's
   `population/<member>/rating` and `population/<member>/eval/exploitability`
3. writes kuhn.json (the curves), kuhn.png (kuhn_population.png too, each member's curve, with
   a population), and, for the first seed, policy_start.json and
   policy_final.json ({open_spiel information state: {"Pass": p, "Bet": q}}; Pass is check or
   fold, Bet is bet or call), and ends with `RESULT kuhn_exploitability_start`,
   `kuhn_exploitability_final`, `kuhn_card_dependence_start` and `kuhn_card_dependence_final`
   and their `_se_seeds` (standard error over training seeds); kuhn.png plots the card
   dependence under the exploitability
4. the average of the iterates: each evaluation also logs its table (`eval/p_bet/<state>`),
   and the report scores the mixture of every updated model so far, one drawn per hand
   (`exploitability.mixture`; no-regret self-play converges to Nash in that average, not
   necessarily in its last iterate): the dashed curves of kuhn.png,
   `RESULT kuhn_exploitability_average` (the mixture of all of them) and its `_se_seeds`,
   and the first seed's table as policy_average.json; beside it the mixture weighted
   linearly (the t-th updated model weighs t, CFR+'s averaging; `average.weights: linear`):
   the dotted curves, `RESULT kuhn_exploitability_average_linear`
5. prints each seed's final table beside how often self-play reaches each information state
   (`exploitability.reach`): a mistake where that is rare gets little signal, and the three
   states whose move alone, changed, would cut the exploitability most
   (`exploitability.one_state_fixes`): one large cut means one mistake, many small ones an
   error spread over the table
6. with `--set average={}` (the recipe's `average`), the loop's own distillation of each
   seed's iterates into one model after the last iteration (`sparring.loop.tasks.average`:
   the last checkpoint fine-tuned on every iteration's rollout, each played by that
   iteration's model, at the temperature it was sampled at; the mixture of the rollouts'
   models, the start to the one before the last, as one model the run registers) and its
   evaluation: a star beside each seed's last point in kuhn.png,
   `RESULT kuhn_exploitability_distilled` and its `_se_seeds`

`--merge DIR...` runs nothing: it reports the `--out` folders of earlier invocations (say one
process per seed, side by side on one GPU) as one, from the curves each wrote as it went; a
run stopped early counts its last evaluation as its final. With `--average` it first runs
that distillation (the config's `average`, or its default, then any `--set`: say
`average.source=tables`, the exact mixture of the logged tables) on each folder's stored run
(`<folder>/store/<run>/<iteration>/`), for runs made without it.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from learning import measured, saved_config, saved_figure  # bench/learning.py, next to this file

from sparring.cli.options import load_config, parse_params
from sparring.games.textarena.exploitability import (
    INFO_STATES,
    TablePolicy,
    card_dependence,
    exploitability,
    mixture,
    one_state_fixes,
    reach,
    read_policy,
    table,
)
from sparring.generation.hf import HFBackend
from sparring.loop import tasks
from sparring.loop.config import CONFIG_DIR, PipelineConfig
from sparring.loop.plan import plan
from sparring.loop.runner import Iteration, run_loop
from sparring.recipe import Average
from sparring.stats import mean_se

METRIC = "eval/exploitability"
CARDS = "eval/card_dependence"  # the spread of P(bet or call) over the cards
# What a row prints beside the exploitability (those present), and with a population each
# member's rating and exploitability (`population/<member>/...`).
SHOWN = (
    CARDS,
    "rollout/normalized_reward",
    "eval/vs_scripted/all/normalized_reward",
    "train/no_signal",
)
MEMBERS = ("/rating", f"/{METRIC}")
BETS = "eval/p_bet/"  # + an information state: the evaluated table's P(bet or call) there


def row(metrics: dict[str, float]) -> dict[str, float]:
    """What a curve keeps of an iteration's metrics besides the exploitability: `SHOWN`, and
    each population member's rating and exploitability."""
    return {
        k: v
        for k, v in metrics.items()
        if k in SHOWN or k.startswith(BETS) or (k.startswith("population/") and k.endswith(MEMBERS))
    }


def tables(curve: list[dict]) -> list[TablePolicy]:
    """The updated models' tables (the rows after the start's); [] where the rows lack them."""
    rows = curve[1:]
    if not rows or any(BETS + INFO_STATES[0] not in r for r in rows):
        return []
    return [table(r, "eval/") for r in rows]


def averaged(curve: list[dict], weights: str = "uniform") -> list[float]:
    """The exploitability of the mixture of the updated models up to each iteration, weighted
    as the recipe's `average.weights` would; [] where the rows lack their tables."""
    logged, weigh = tables(curve), Average(weights=weights).mixture_weights
    return [exploitability(mixture(logged[: i + 1], weigh(i + 1))) for i in range(len(logged))]


def policy(cfg: PipelineConfig, model: Path) -> dict[str, dict[str, float]]:
    """The table `eval/exploitability` scored: `model` read out at the eval temperature."""
    backend = HFBackend(str(model), device=cfg.device)
    return read_policy(backend, cfg.game.make(), cfg.eval.rollout.sampling.temperature)


def distilled_row(metrics: dict[str, float], iterations: list[int]) -> dict:
    """What kuhn.json keeps of the distilled model's evaluation."""
    return {METRIC: metrics[METRIC], CARDS: metrics[CARDS], "iterations": iterations}


def distill(folder: Path, saved: dict, seed: str, out: Path, sets: list[str]) -> dict:
    """6., for a run made without `average`: the loop's distillation (`tasks.average`, the
    config's `average` or its default, then `sets`, seeded as the run was) of the run `folder`
    stored, read out as `eval/exploitability` is."""
    on = [] if saved_config(saved).average else ["average={}"]
    cfg = saved_config(saved | {"set": [*saved["set"], *on, *sets]})
    cfg = measured(cfg, int(seed), folder)  # the run's seeds, its store
    run, done = stored_run(folder, saved, seed), [step.iteration for step in plan(cfg)]
    tasks.average(cfg, str(run / str(done[-1]) / "checkpoint"), run.name, out)
    table = policy(cfg, out)
    return distilled_row({METRIC: exploitability(table), CARDS: card_dependence(table)}, done)


def stored_run(folder: Path, saved: dict, seed: str) -> Path:
    """Where a bench folder's store keeps `seed`'s run: the name `saved["runs"]` recorded, or
    the store's only run (a folder of one seed, written before runs were recorded)."""
    if name := saved.get("runs", {}).get(seed):
        return folder / "store" / name
    runs = sorted(p for p in (folder / "store").glob("*") if p.is_dir())
    if len(runs) != 1:
        raise SystemExit(f"{folder}/store holds {len(runs)} runs and kuhn.json names none for "
                         f"seed {seed}; distill a folder of one seed")  # fmt: skip
    return runs[0]


def plot(
    curves: dict[int, list[dict]],
    averages: dict[int, list[float]],
    path: Path,
    title: str,
    distilled: dict | None = None,
    linear: dict[int, list[float]] | None = None,
) -> None:
    """Each seed's exploitability per iteration, its iterates' mixture dashed (`averages`,
    where logged), weighted linearly dotted (`linear`), their distillation a star beside the
    last point (`distilled`) and, below it where logged, its card dependence (0: the card
    ignored, .75 at Nash, 1: the value strategy)."""
    cards = any(CARDS in r for c in curves.values() for r in c)
    with saved_figure(path, title, size=(6.5, 6.4 if cards else 3.8), rows=1 + cards) as axes:
        ax = axes[0]
        for seed, curve in curves.items():
            x, y = [r["iteration"] for r in curve], [r[METRIC] for r in curve]
            line = ax.plot(x, y, "o-", label=f"seed {seed}")[0]
            if average := averages[seed]:
                ax.plot(x[1:], average, "--", color=line.get_color(),
                        label=f"seed {seed}, the iterates mixed")  # fmt: skip
            if weighted := (linear or {}).get(seed):
                ax.plot(x[1:], weighted, ":", color=line.get_color(),
                        label=f"seed {seed}, mixed linearly")  # fmt: skip
            if seed in (distilled or {}):
                ax.plot(x[-1] + 0.2, distilled[seed][METRIC], "*", ms=11, color=line.get_color(),
                        label=f"seed {seed}, the iterates distilled")  # fmt: skip
        ax.axhline(11 / 24, color="gray", ls="--", lw=1, label="uniform random (0.458)")
        ax.axhline(1 / 3, color="gray", ls=":", lw=1, label="always bet or call (0.333)")
        ax.axhline(0, color="black", lw=0.8)
        ax.set_ylabel("exploitability (chips per hand)")
        ax.legend(fontsize=8)
        if cards:
            below = axes[1]
            for seed, curve in curves.items():
                rows = [r for r in curve if CARDS in r]
                below.plot([r["iteration"] for r in rows], [r[CARDS] for r in rows], "o-",
                           label=f"seed {seed}")  # fmt: skip
            below.axhline(0.75, color="gray", ls="--", lw=1, label="Nash (0.75)")
            below.set_ylim(-0.05, 1.05)
            below.set_ylabel("card dependence")
            below.legend(fontsize=8)
        axes[-1].set_xlabel("iteration (the first point: the start, before any update)")


def plot_population(curves: dict[int, list[dict]], path: Path, title: str) -> None:
    """With a population: each member's exploitability per iteration (the lead's ring marks
    the best-rated member, whose figure is the iteration's), one panel per seed."""
    with saved_figure(path, title, size=(6.5, 2.6 * len(curves)), rows=len(curves)) as axes:
        for ax, (seed, curve) in zip(axes, curves.items(), strict=True):
            rows = [r for r in curve if r["iteration"] >= 0]
            members = sorted({k.split("/")[1] for r in rows for k in r if k.endswith("/rating")})
            x = [r["iteration"] for r in rows]
            for m in members:
                ax.plot(x, [r[f"population/{m}/{METRIC}"] for r in rows], "o-", ms=3, label=m)
            ax.plot(x, [r[METRIC] for r in rows], "o", mfc="none", ms=9, color="black",
                    label="lead (best rated)")  # fmt: skip
            ax.axhline(1 / 3, color="gray", ls=":", lw=1, label="always bet or call")
            ax.set_ylabel(f"seed {seed}: exploitability", fontsize=8)
            ax.legend(fontsize=7)
        ax.set_xlabel("iteration")


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--config", default=str(CONFIG_DIR / "kuhn.yaml"), help="a pipeline config")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a config field (dotted path, YAML value); repeatable; with "
                         "--merge --average, the distillation's (average.source=tables)")  # fmt: skip
    ap.add_argument("--seeds", type=int, nargs="+", default=[0], help="training seeds")
    ap.add_argument("--out", help="work folder (default: a temp folder)")
    ap.add_argument("--merge", nargs="+", metavar="DIR",
                    help="run nothing: report the --out folders of earlier invocations as one")  # fmt: skip
    ap.add_argument("--average", action="store_true",
                    help="with --merge: distill each stored run's iterates into one model "
                         "(the recipe's average) and score it")  # fmt: skip
    args = ap.parse_args()

    out = Path(args.out or tempfile.mkdtemp(prefix="sparring-kuhn-"))
    out.mkdir(parents=True, exist_ok=True)
    if args.merge:
        merged = {"curves": {}, "distilled": {}, "runs": {}}
        for folder in map(Path, args.merge):
            run = json.loads((folder / "kuhn.json").read_text())
            for seed in run["curves"] if args.average else ():  # 6., from the stored iterates
                out_dir = out / f"seed-{seed}-average"
                distilled = distill(folder, run, seed, out_dir, args.set)
                run.setdefault("distilled", {})[seed] = distilled
            merged = run | {k: merged[k] | run.get(k, {}) for k in ("curves", "distilled", "runs")}
        report(merged, out)
        return
    base = load_config(PipelineConfig, args.config, parse_params(tuple(args.set)))
    saved = {"config": args.config, "set": args.set, "curves": {}, "runs": {}, "distilled": {}}
    curves: dict[int, list[dict]] = saved["curves"]
    # 1. every training seed through the product's loop; 2. each evaluation's exploitability
    for seed in args.seeds:
        curve = curves.setdefault(seed, [])

        def on_iteration(it: Iteration, curve: list = curve, seed: int = seed) -> None:
            curve.append({"seed": seed, "iteration": it.iteration, METRIC: it.metrics[METRIC]})
            curve[-1] |= row(it.metrics)
            print(json.dumps(curve[-1]), flush=True)
            (out / "kuhn.json").write_text(json.dumps(saved))

        cfg = measured(base, seed, out)
        result = run_loop(cfg, out / f"seed-{seed}", on_iteration=on_iteration)
        saved["runs"][seed] = result.run_name
        if result.average:  # 6. the iterates as one model
            done = [it.iteration for it in result.iterations]
            saved["distilled"][seed] = distilled_row(result.average.metrics, done)
            (out / "kuhn.json").write_text(json.dumps(saved))
        if seed == args.seeds[0]:  # 3. the first seed's tables
            for name, it in (("start", result.start), ("final", result.iterations[-1])):
                (out / f"policy_{name}.json").write_text(
                    json.dumps(policy(cfg, it.model_dir), indent=1, sort_keys=True)
                )
            if logged := tables(curve):
                mixed = mixture(logged)
                (out / "policy_average.json").write_text(
                    json.dumps(mixed, indent=1, sort_keys=True)
                )
    report(saved, out)


def report(saved: dict, out: Path) -> None:
    """kuhn.json, kuhn.png and the RESULT lines of `saved` (config, set, curves by seed)."""
    base = saved_config(saved)
    curves = saved["curves"]
    start = [c[0][METRIC] for c in curves.values()]
    final = [c[-1][METRIC] for c in curves.values()]
    averages = {seed: averaged(c) for seed, c in curves.items()}
    linear = {seed: averaged(c, "linear") for seed, c in curves.items()}
    distilled = saved.get("distilled", {})
    (out / "kuhn.json").write_text(json.dumps(saved, indent=1))
    title = f"{base.name} ({base.model}): exploitability per iteration"
    plot(curves, averages, out / "kuhn.png", title, distilled, linear)
    if base.population:
        title = f"{base.name}: a population of {base.population.size}, each member"
        plot_population(curves, out / "kuhn_population.png", title)
    print(f"curves, tables and plot in {out}")
    for seed, curve in curves.items():  # where the final table stands, and how often it is met
        if logged := tables(curve):
            last, met = logged[-1], reach(logged[-1])
            cells = (f"{s} {last[s]['Bet']:.2f} ({met[s]:.3f})" for s in INFO_STATES)
            print(f"seed {seed}, final P(bet or call) (self-play reach):", ", ".join(cells))
            fixes = sorted(one_state_fixes(last).items(), key=lambda kv: kv[1][1])[:3]
            cells = (f"{s} {last[s]['Bet']:.2f} -> {bet:.2f}: {e:.3f}" for s, (bet, e) in fixes)
            print(f"seed {seed}: exploitability with one state of the final table changed:",
                  ", ".join(cells))  # fmt: skip
    figures = {f"kuhn_exploitability_{name}": v for name, v in (("start", start), ("final", final))}
    if all(CARDS in c[0] and CARDS in c[-1] for c in curves.values()):
        figures |= {f"kuhn_card_dependence_{name}": [c[i][CARDS] for c in curves.values()]
                    for name, i in (("start", 0), ("final", -1))}  # fmt: skip
    if all(averages.values()):
        figures["kuhn_exploitability_average"] = [a[-1] for a in averages.values()]
        figures["kuhn_exploitability_average_linear"] = [a[-1] for a in linear.values()]
    if distilled and set(distilled) == set(curves):
        for seed, d in distilled.items():
            print(f"seed {seed}: the iterates of iterations {d['iterations']} distilled: "
                  f"exploitability {d[METRIC]:.3f}, card dependence {d[CARDS]:.2f}")  # fmt: skip
        figures["kuhn_exploitability_distilled"] = [d[METRIC] for d in distilled.values()]
    for name, values in figures.items():
        mean, se = mean_se(values)  # se over training seeds (nan for one seed)
        print(f"RESULT {name} {mean:.4f}")
        print(f"RESULT {name}_se_seeds {se:.4f}")


if __name__ == "__main__":
    main()
