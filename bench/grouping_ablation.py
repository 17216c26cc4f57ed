"""Seed 001's open question: does grouping GRPO advantages by country beat grouping by initial
state and country (`init_seat`: each power's own per-prompt baseline), by initial state alone
(all seven powers in one group) or one batch-wide group? The product's loop, per arm. An arm is
a group key (`country`, `init_seat`, `country_stage`, `init`, `batch`) or `rae`: SPIRAL's
per-country EMA baseline kept across updates (`train.advantage: rae` over the `role` column).

    .venv/bin/python bench/grouping_ablation.py             # configs/diplomacy-ablation.yaml
    .venv/bin/python bench/grouping_ablation.py --set opponents.selfplay_fraction=1 \\
        --set games_per_iteration=32 --seeds 0   # self-play: the learner in all seven seats
    .venv/bin/python bench/grouping_ablation.py --set iterations=1 --set game_init.num_train=7 \\
        --set games_per_iteration=28 --set game_init.num_val=1 --seeds 0   # smoke size
    .venv/bin/python bench/grouping_ablation.py --merge /tmp/d0 /tmp/d1 --out /tmp/all
    python bench/grouping_ablation.py --set model=smollm2-135m-instruct --set device=auto \\
        --set warm_start.train.lora_rank=16 --set train.lora_rank=16   # a real model, one GPU

1. the config's warm start runs once (`sparring.loop.tasks`), so every arm starts from the same
   checkpoint; it is evaluated as the "warm start" bar
2. per training seed and arm (`--keys`), `sparring.loop.runner.run_loop` from that
   checkpoint with `train.group_key` = the key (or the `rae` fields): the loop `sparring run`
   runs, with files in `--out` (no S3) and no tracking. A training seed moves the rollout's
   sampling seed (by 1000) and the GRPO seed; the states and the evaluation's draws are the
   same for every arm
3. an arm's score is its final model's evaluation on the held-out test states (the loop's test
   step, with `game_init.num_test` > 0 as in the recipe; without test states, its last
   evaluation on val): the learner in each country against `eval.opponent` (greedy), its
   reward per game, whose mean is the champion metric. The warm start's score is the test
   step's start, the same checkpoint for every arm
4. the league (`league`): each seed's final checkpoints play each other on the same states
   (test, else val), every arm every power once per state, against a mix of the other arms
5. prints a JSON line per finished run, writes grouping_ablation.json, grouping_ablation.png
   and grouping_ablation_league.png, and compares country with `init_seat` (the state x
   country grouping seed 001's question is about; Diplomacy calls it `init_country`) and with
   `init`, paired game by game within each seed: `RESULT country_vs_init_country_gain <mean
   over seeds>` with `_ci95_low` and `_ci95_high` (Student's t over the seeds' means; over the
   games with one seed), then the same for `country_vs_init`, then both in the league
   (`league_country_vs_init_country_gain`, ..., paired by state and power)

`--merge DIR...` runs nothing: it reports the `--out` folders of earlier invocations (say one
process per seed, side by side on one GPU) as one invocation with all their seeds would.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np
from learning import saved_config, saved_figure  # bench/learning.py, next to this file
from scipy import stats

from sparring.cli.options import load_config, parse_params
from sparring.loop import tasks
from sparring.loop.config import CONFIG_DIR, PipelineConfig
from sparring.loop.runner import run_loop
from sparring.rollout import build_policies, load_inits, play_games
from sparring.stats import mean_se, paired_gain


def local(base: PipelineConfig, out: Path, **fields) -> PipelineConfig:
    """`base` with `fields` set (dotted keys), files under `out`, nothing tracked."""
    data = base.model_dump(mode="json", exclude_unset=True)
    data |= {"storage": {"root": str(out / "store")}, "tracking": {"enabled": False}}
    for key, value in fields.items():
        *parents, leaf = key.split(".")
        node = data
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return PipelineConfig.model_validate(data)


def shared_warm_start(base: PipelineConfig, out: Path) -> tuple[PipelineConfig, Path, Path]:
    """The arms' one warm start (under `out/warm`), evaluated on val: (the local config, the
    warm-started model, its evaluation folder)."""
    cfg, ws = local(base, out), out / "warm"
    inits = tasks.game_init(cfg, ws / "inits", "warm")
    warm = tasks.initial_model(cfg, ws / "initial")
    if cfg.warm_start:
        tasks.warm_start(cfg.for_step("warm-start"), str(warm), str(inits["train"]), ws / "model")
        warm = ws / "model"
    tasks.evaluate(cfg.for_step("evaluate"), str(warm), None, str(inits["val"]), ws / "eval",
                   "warm", -1)  # fmt: skip
    return cfg, warm, ws / "eval"


def vs_scripted(cfg: PipelineConfig, eval_dir: Path) -> dict[str, float]:
    """The learner's reward in every val game of `eval_dir` against `cfg.eval.opponent`, by game
    id (game ids of the Diplomacy eval: `<init>/<bot>/<country>#<play>`)."""
    games = json.loads((eval_dir / "rewards.json").read_text())["vs_scripted"]
    roles, out = cfg.game.cls.roles, {}
    for game in games:
        _, bot, country = game["game_id"].split("#")[0].rsplit("/", 2)
        if bot == cfg.eval.opponent:
            out[game["game_id"]] = game["rewards"][roles.index(country)]
    return out


def _bot(game_id: str) -> str:
    """The scripted opponent of a vs_scripted game id."""
    return game_id.split("#")[0].rsplit("/", 2)[1]


def scores(cfg: PipelineConfig, folder: Path, run: dict, model: str = "final") -> dict[str, float]:
    """The learner's reward per game against `cfg.eval.opponent` of a run's `final` model (or
    its `start`, the warm start) on the test states (its test step), else on val (its last
    evaluation; the warm start's own evaluation)."""
    test = folder / f"{run['key']}-seed-{run['seed']}" / "test" / "test.json"
    if test.exists():
        games = json.loads(test.read_text())["scores"][model]
        return {g: r for g, r in games.items() if _bot(g) == cfg.eval.opponent}
    return vs_scripted(cfg, final_dir(folder, run) / "eval" if model == "final" else
                       folder / "warm" / "eval")  # fmt: skip


def split(folder: Path) -> str:
    """The states the arms are scored on: test where game-init wrote them, else val."""
    return "test" if (folder / "warm" / "inits" / "test.parquet").exists() else "val"


def final_dir(folder: Path, run: dict) -> Path:
    """The folder of a run's last iteration (its `eval`, its `trained` checkpoint)."""
    return folder / f"{run['key']}-seed-{run['seed']}" / str(len(run["curve"]) - 1)


def league(cfg: PipelineConfig, folder: Path, runs: list[dict], play: bool = True) -> dict:
    """One seed's `runs` (of `folder`), their final checkpoints against each other on the test
    states (else val; no arm was chosen on either): in the j-th of A games per state power i is
    played by arm (i + j) mod A (A <= 7 arms), so every arm plays every power once against a
    mix of the others. Returns each arm's reward by `<init>/<power>`, paired across arms by
    position; cached as league-seed-S.json (league-test-seed-S.json on test). With `play`
    False only the cache is read ({} without one)."""
    states = split(folder)
    cache = folder / f"league-{'test-' if states == 'test' else ''}seed-{runs[0]['seed']}.json"
    if cache.exists() or not play:
        return json.loads(cache.read_text()) if cache.exists() else {}
    roles, arms = cfg.game.cls.roles, [r["key"] for r in runs]
    if len(arms) > len(roles):
        raise ValueError(f"a league seats at most {len(roles)} arms, got {len(arms)}")
    models = {r["key"]: str(final_dir(folder, r) / "trained") for r in runs}
    policies = build_policies(cfg.game, None, arms, cfg.device, extra_models=models)
    seating, games = {}, []  # game id -> the arm in each seat; (game id, state)
    for init, state in load_inits(folder / "warm" / "inits" / f"{states}.parquet",
                                  cfg.eval.num_games):  # fmt: skip
        for j in range(len(arms)):
            seating[f"{init}@{j}"] = [arms[(i + j) % len(arms)] for i in range(len(roles))]
            games.append((f"{init}@{j}", state))
    out: dict[str, dict] = {a: {} for a in arms}
    plan = list(seating.values())
    for ep in play_games(cfg.game, cfg.eval.rollout.sampling, games, policies, plan):
        for power, arm, reward in zip(roles, seating[ep.init_id], ep.rewards, strict=True):
            out[arm][f"{ep.init_id.rsplit('@', 1)[0]}/{power}"] = reward
    cache.write_text(json.dumps(out))
    return out


def paired(arm: dict[int, dict[str, float]], other: dict[int, dict[str, float]]) -> dict | None:
    """`arm` minus `other`, paired game by game within each training seed both finished (a run
    cut short leaves its seed out; None when no seed has both): the mean over seeds of each
    seed's mean difference and its 95% interval (Student's t over the seeds' means, whose spread
    holds training and evaluation noise; over the games when there is one seed)."""
    seeds = [seed for seed in arm if seed in other]
    per_seed = {seed: paired_gain(other[seed], arm[seed]) for seed in seeds}
    if len(per_seed) > 1:
        (gain, se), df = mean_se([d for d, _ in per_seed.values()]), len(per_seed) - 1
    elif per_seed:
        (gain, se), df = per_seed[seeds[0]], len(arm[seeds[0]]) - 1
    else:
        return None
    half = float(stats.t.ppf(0.975, df) * se)
    return {"gain": gain, "ci95": [gain - half, gain + half], "per_seed": per_seed}


def summary(rewards: list[float]) -> dict:
    """Mean, standard error and count of eval games."""
    r = np.array(rewards)
    se = float(r.std(ddof=1) / np.sqrt(len(r))) if len(r) > 1 else 0.0
    return {"mean": float(r.mean()), "se": se, "n": len(r)}


def plot(gains: dict[str, dict], path: Path, title: str, ylabel: str) -> None:
    """Each arm's paired gain (a `paired` result) with its 95% interval; dots: the seeds."""
    with saved_figure(path, title, size=(6, 3.5)) as ax:
        names = list(gains)
        mean = np.array([gains[n]["gain"] for n in names])
        ci = np.array([gains[n]["ci95"] for n in names])  # (arms, 2)
        ax.errorbar(range(len(names)), mean, yerr=[mean - ci[:, 0], ci[:, 1] - mean], fmt="o",
                    capsize=5, color="tab:blue", label="mean over seeds, 95% interval")  # fmt: skip
        for i, n in enumerate(names):
            seeds = [d for d, _ in gains[n]["per_seed"].values()]
            ax.plot(
                [i + 0.15] * len(seeds), seeds, "k.", label="training seeds" if i == 0 else None
            )
        ax.axhline(0, color="grey", lw=0.8)
        ax.set_xticks(range(len(names)), names, rotation=20)
        ax.set_ylabel(ylabel, fontsize=8)
        ax.set_xlabel("arm (GRPO group key)")
        ax.legend(fontsize=7)


# arms that are not a group key: their train fields (rae logs its groups' stats by country)
VARIANTS = {
    "rae": {"train.advantage": "rae", "train.rae_key": "role", "train.group_key": "country"}
}

# (RESULT name, the arm country is compared with): state x country first, seed 001's question
COMPARED = (("country_vs_init_country", "init_seat"), ("country_vs_init", "init"))


def report(folders: list[Path], out: Path, play: bool = True) -> None:
    """The report of the runs in `folders` (one invocation's `--out`, or several run side by
    side): each arm's last evaluation against the opponent, pooled and per seed, country against
    the other arms paired game by game; grouping_ablation.json and .png in `out`. With `play`
    False (a merge) the league holds the seeds whose league was played where they ran."""
    saved = [json.loads((f / "grouping_ablation.json").read_text()) for f in folders]
    base = saved_config(saved[0])
    warm, games, runs, played = {}, {}, [], {}  # seed -> id -> reward; games, played by arm
    for folder, s in zip(folders, saved, strict=True):
        runs += s["runs"]
        for run in s["runs"]:
            games.setdefault(run["key"], {})[run["seed"]] = scores(base, folder, run)
        for seed in dict.fromkeys(r["seed"] for r in s["runs"]):
            of_seed = [r for r in s["runs"] if r["seed"] == seed]
            warm[seed] = scores(base, folder, of_seed[0], "start")  # every arm's start
            for key, rewards in league(base, folder, of_seed, play).items():
                played.setdefault(key, {})[int(seed)] = rewards
    arms, leagues = {}, {}
    for table, per_arm in ((arms, {"warm start": warm} | games), (leagues, played)):
        for key, per_seed in per_arm.items():
            means = {seed: float(np.mean(list(g.values()))) for seed, g in per_seed.items()}
            table[key] = summary([r for g in per_seed.values() for r in g.values()]) | {
                "per_seed": means
            }
    # runs cut short (a folder's JSON lists the runs that finished) leave their seed out of a
    # comparison; a comparison no seed finished is left out
    compared = [(name, games, o) for name, o in COMPARED] + [
        (f"league_{name}", played, o) for name, o in COMPARED
    ]
    versus = {
        name: v
        for name, table, o in compared
        if "country" in table and o in table and (v := paired(table["country"], table[o]))
    }
    gains = {key: {"over warm start": paired(per_seed, warm)} for key, per_seed in games.items()}
    for key in [k for k in games if k != "init_seat" and "init_seat" in games]:
        for name, table in (("over init_seat", games), ("league, over init_seat", played)):
            if key in table and "init_seat" in table:
                if v := paired(table[key], table["init_seat"]):
                    gains[key][name] = v
    for title, table in (("against greedy", arms), ("in the league", leagues)):
        print(f"{title}, on the {split(folders[0])} states")
        for name, a in table.items():
            seeds = " ".join(f"{m:.4f}" for m in a.get("per_seed", {}).values())
            print(f"  {name:13s} {a['mean']:.4f} ± {a['se']:.4f} (n={a['n']}) {seeds}")
    print("paired gains, mean over seeds [95% interval]")
    for key, by in gains.items():
        cells = (
            f"{n} {v['gain']:+.4f} [{v['ci95'][0]:+.4f}, {v['ci95'][1]:+.4f}]"
            for n, v in by.items()
        )
        print(f"  {key:13s} " + "; ".join(cells))
    kept = {k: saved[0][k] for k in ("config", "set", "metric")}
    result = kept | {
        "states": split(folders[0]),
        "arms": arms,
        "league": leagues,
        "gains": gains,
        "runs": runs,
        "versus": versus,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "grouping_ablation.json").write_text(json.dumps(result, indent=1))
    title = f"{base.name}: the arms' final checkpoints, paired"
    over_warm = {key: by["over warm start"] for key, by in gains.items()}
    league_gains = {
        key: by["league, over init_seat"]
        for key, by in gains.items()
        if "league, over init_seat" in by
    }
    plot(over_warm, out / "grouping_ablation.png", title,
         f"reward vs {base.eval.opponent}: gain over the warm start")  # fmt: skip
    if league_gains:
        plot(league_gains, out / "grouping_ablation_league.png", title,
             "reward against each other: gain over init_seat")  # fmt: skip
    print(f"results in {out}")
    for name, v in versus.items():
        print(f"RESULT {name}_gain {v['gain']:.4f}")
        print(f"RESULT {name}_ci95_low {v['ci95'][0]:.4f}")
        print(f"RESULT {name}_ci95_high {v['ci95'][1]:.4f}")


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--config", default=str(CONFIG_DIR / "diplomacy-ablation.yaml"))
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a config field (dotted path, YAML value); repeatable")  # fmt: skip
    ap.add_argument(
        "--keys", nargs="+", default=["country", "init_seat", "init", "batch"], help="the arms"
    )
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1], help="training seeds")
    ap.add_argument("--out", help="work folder (default: a temp folder)")
    ap.add_argument("--merge", nargs="+", metavar="DIR",
                    help="run nothing: report the --out folders of earlier invocations (one per "
                    "seed, run side by side) as one, in --out")  # fmt: skip
    args = ap.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="sparring-ablation-"))
    if args.merge:
        report([Path(f) for f in args.merge], out, play=False)
        return
    if not {"country", "init_seat"} <= set(args.keys):
        ap.error("--keys must include country and init_seat (the RESULT compares them)")

    base = load_config(PipelineConfig, args.config, parse_params(tuple(args.set)))
    # 1. the shared warm start, evaluated
    cfg, warm, _ = shared_warm_start(base, out)
    # 2. every arm and seed from that checkpoint; 3. its last evaluation
    saved = {"config": args.config, "set": args.set, "metric": base.champion_metric, "runs": []}
    for seed in args.seeds:
        for key in args.keys:
            run = out / f"{key}-seed-{seed}"
            seeded = {"train.seed": seed, "rollout.sampling.seed": 1000 * seed}
            arm = VARIANTS.get(key, {"train.group_key": key})
            cfg = local(base, out, run_name=run.name, model=str(warm), warm_start=None,
                        **seeded, **arm)  # fmt: skip
            its = run_loop(cfg, run).iterations
            curve = [it.metrics[cfg.champion_metric] for it in its]
            rollout = [it.metrics["rollout/normalized_reward"] for it in its]
            saved["runs"].append({"key": key, "seed": seed, "curve": curve, "rollout": rollout})
            saved["runs"][-1] |= summary(list(scores(cfg, out, saved["runs"][-1]).values()))
            print(json.dumps(saved["runs"][-1]), flush=True)
            (out / "grouping_ablation.json").write_text(json.dumps(saved, indent=1))
    # 4. the league and 5. the report
    report([out], out)


if __name__ == "__main__":
    main()
