"""A population in the loop (sparring.loop.population): members seated from the population,
each trained on its own seats and registered under its own alias, the state carried from
rollout to rollout: a resumed run continues the ratings, a retried rollout does not apply its
update twice, and the weakest takes the strongest's weights at the interval."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from safetensors.torch import load_file

from sparring.cli.options import load_config, parse_params
from sparring.loop import population, tasks
from sparring.loop.config import PipelineConfig
from sparring.loop.runner import run_loop
from sparring.population import Population
from sparring.tracking import PipelineRun, TrackingConfig, connect

ROOT = Path(__file__).resolve().parents[2]
# configs/pipeline.yaml at the smallest size that plays, trains and evaluates; two specialists
TINY = ("iterations=2", "games_per_iteration=8", "game_init.num_val=2", "warm_start=null")
TINY += ("game_init.num_train=8",)  # 2 iterations x 4 states; a recipe's 512 take ~40 s at k=2
TINY += ("game_init.num_test=0", "game.params.max_turns=2", "rollout.games_per_init=2")
TINY += ("rollout.sampling.max_new_tokens=8", "eval.rollout.sampling.max_new_tokens=8")
TINY += ("evaluate_start=false", "tracking.enabled=false", "train.group_key=batch")
TINY += ("train.mini_batch_size=8", "train.micro_batch_size=8", "train.rejected_credit=penalty")
TINY += ("population={size: 2, roles: [[player_a], [player_b]]}",)


def tiny_config(model: Path, store: Path, *more: str) -> PipelineConfig:
    sets = (*TINY, f"model={model}", f"storage.root={store}", "campaign=c", *more)
    return load_config(PipelineConfig, str(ROOT / "configs" / "pipeline.yaml"), parse_params(sets))


def weights(folder: str | Path):
    return load_file(str(Path(folder) / "model.safetensors"))


def state(work: Path, i: int) -> dict:
    return json.loads((work / str(i) / "rollout" / population.STATE_FILE).read_text())


def test_members_play_their_roles_train_on_their_seats_and_resume(tiny_model_dir, tmp_path):
    store = tmp_path / "store"
    cfg = tiny_config(tiny_model_dir, store)
    first = run_loop(cfg, tmp_path / "a")
    work = tmp_path / "a"
    plan = [json.loads(x) for x in (work / "0" / "rollout" / "seat_plan.jsonl").open()]
    assert {tuple(row["seats"]) for row in plan} == {("member-0", "member-1")}
    samples = pd.read_parquet(work / "0" / "rollout" / "samples.parquet")
    assert sorted(samples.policy.unique()) == ["member-0", "member-1"]
    # each member trained on its own rows from the same start: two different checkpoints
    a, b = (
        weights(work / "0" / "trained" / "member-0"),
        weights(work / "0" / "trained" / "member-1"),
    )
    assert any((a[k] != b[k]).any() for k in a)
    it = first.iterations[-1]
    assert it.metrics["population/games_rated"] == 8  # every game seats both members
    assert (
        it.metrics["eval/selfplay/all/normalized_reward"]
        == it.metrics[f"population/{it.model_dir.name}/eval/selfplay/all/normalized_reward"]
    )  # the iteration's eval is its lead member's
    for m in ("member-0", "member-1"):  # stored under their own names
        assert (store / "c" / "1" / "members" / m / "checkpoint" / "model.safetensors").is_file()
        assert (store / "c" / "1" / "eval" / m / "metrics.json").is_file()
    # a resumed run (the campaign's next block) continues the ratings and the members
    resumed = cfg.model_copy(update={"first_iteration": 2, "iterations": 1})
    run_loop(resumed, tmp_path / "b")
    after = state(tmp_path / "b", 2)
    assert [row["iteration"] for row in after["history"]] == [0, 1, 2]
    assert after["history"][:2] == state(work, 1)["history"]
    restored = tmp_path / "b" / "resumed" / "member-1" / "model.safetensors"
    assert all((v == weights(work / "1" / "trained" / "member-1")[k]).all()
               for k, v in load_file(str(restored)).items())  # fmt: skip


@pytest.fixture
def rolled(tiny_model_dir, tmp_path) -> tuple[PipelineConfig, Path]:
    """One population rollout (iteration 0) of the tiny config, replacing every iteration."""
    cfg = tiny_config(tiny_model_dir, tmp_path / "store", "population.replace_every=1")
    inits = tasks.game_init(cfg, tmp_path / "inits", "c")
    members = dict.fromkeys(cfg.population.members, str(tiny_model_dir))
    population.rollout(cfg, members, str(inits["train"]), 0, 8, tmp_path / "0", "c")
    return cfg, tmp_path


def test_a_retried_rollout_applies_its_rating_update_once(rolled, tiny_model_dir):
    cfg, tmp = rolled
    members = dict.fromkeys(cfg.population.members, str(tiny_model_dir))
    previous = tmp / "0" / population.STATE_FILE
    for attempt in ("try", "retry"):
        population.rollout(cfg, members, str(tmp / "inits" / "train.parquet"), 1, 8,
                           tmp / attempt, "c", previous)  # fmt: skip
    tried, retried = (
        json.loads((tmp / a / population.STATE_FILE).read_text()) for a in ("try", "retry")
    )
    assert tried == retried
    assert [row["iteration"] for row in retried["history"]] == [0, 1]
    # without `previous` the rollout reads the state rollout 0 stored, the same one
    population.rollout(cfg, members, str(tmp / "inits" / "train.parquet"), 1, 8, tmp / "s", "c")
    assert json.loads((tmp / "s" / population.STATE_FILE).read_text()) == tried


def test_the_weakest_member_starts_from_the_strongest_at_the_interval(rolled, tmp_path):
    cfg, tmp = rolled
    saved = Population.from_dict(json.loads((tmp / "0" / population.STATE_FILE).read_text()))
    saved.ratings = {"member-0": [20.0, 2.0], "member-1": [30.0, 2.0]}
    previous = tmp / "planted.json"
    previous.write_text(json.dumps(saved.to_dict()))
    members = {"member-0": str(tmp / "m0"), "member-1": str(tmp / "m1")}
    for m in members.values():  # two distinct checkpoints, to see whose weights are played
        Path(m).symlink_to(cfg.model)
    _, starts = population.rollout(cfg, members, str(tmp / "inits" / "train.parquet"), 1, 8,
                                   tmp / "1", "c", previous)  # fmt: skip
    assert starts == {"member-0": members["member-1"], "member-1": members["member-1"]}
    after = json.loads((tmp / "1" / population.STATE_FILE).read_text())
    assert {"iteration": 1, "replaced": "member-0", "by": "member-1"} in after["history"]


def test_each_member_is_registered_under_its_own_alias(tiny_model_dir, tmp_path, mlflow_db):
    """Two members of one iteration are two versions, each under its alias; a retried register
    finds its own member's version."""
    cfg = tiny_config(tiny_model_dir, tmp_path / "store")
    tracking = TrackingConfig(tracking_uri=mlflow_db, experiment="p")
    cfg = cfg.model_copy(update={"tracking": tracking})
    client, parent = connect(tracking), PipelineRun.start(tracking, "c").run_id
    evals = {cfg.champion_metric: 0.5}
    done = [tasks.register(cfg, parent, "c", 0, str(tiny_model_dir), evals, member=m)
            for m in ("member-0", "member-1", "member-0")]  # fmt: skip
    assert [d.version for d in done] == ["1", "2", "1"]
    for m, version in (("member-0", 1), ("member-1", 2)):
        assert client.get_model_version_by_alias(cfg.registered_model, m).version == version
    assert done[1].checkpoint_uri.endswith("/c/0/members/member-1/checkpoint")
