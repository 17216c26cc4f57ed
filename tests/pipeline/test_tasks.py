"""The pipeline steps the KFP components call, tested without KFP: S3 and MLflow faults stop
a step with a clear error before anything is registered; remote model refs load back."""

from __future__ import annotations

import json
import shutil
import time
import uuid
from pathlib import Path

import pytest

from sparring import storage
from sparring.loop import reports, runs, tasks
from sparring.loop.config import PipelineConfig
from sparring.models import resolve_model
from sparring.tracking import PipelineRun, TrackingConfig, TrackingUnavailableError, connect


@pytest.fixture
def cfg(s3_server, mlflow_db, monkeypatch) -> PipelineConfig:
    """A config on the real S3 server and a fresh sqlite MLflow store."""
    for key, value in s3_server.env().items():
        monkeypatch.setenv(key, value)
    return PipelineConfig.model_validate(
        {
            "game": {"params": {"k": 3}},
            "storage": {"root": f"s3://sparring/steps-{uuid.uuid4().hex[:6]}"},
            "tracking": {"tracking_uri": mlflow_db, "experiment": "steps"},
            "registered_model": "steps-model",
        }
    )


def registered(cfg: PipelineConfig) -> list:
    return connect(cfg.tracking).search_model_versions(f"name = '{cfg.registered_model}'")


METRICS = {"eval/selfplay/all/normalized_reward": 0.5, "rollout/normalized_reward": 0.25}


def test_register_then_load_back(cfg, tiny_model_dir, tmp_path, monkeypatch):
    parent = PipelineRun.start(cfg.tracking, "r").run_id
    done = tasks.register(cfg, parent, "r", 0, str(tiny_model_dir), METRICS)
    assert done.checkpoint_uri == f"{cfg.storage.root}/r/0/checkpoint"
    assert (done.version, done.champion_version) == ("1", "1")
    storage.verify(done.checkpoint_uri, deep=True)
    # models:/ -> the version's S3 source -> a verified local copy (cached by URI)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", cfg.tracking.tracking_uri)
    local = Path(resolve_model(f"models:/{cfg.registered_model}@champion", tmp_path / "cache"))
    assert local.parent == tmp_path / "cache"
    files = {p.name for p in local.iterdir() if p.name != ".complete"}
    mlflow_model = {"MLmodel", "components", "python_env.yaml", "requirements.txt"}
    mlflow_model |= {"input_example.json", "serving_input_example.json"}
    assert files == {p.name for p in tiny_model_dir.iterdir()} | mlflow_model
    # the pipeline's first step does the same with the config's registry
    first = cfg.model_copy(update={"model": f"models:/{cfg.registered_model}@champion"})
    tasks.initial_model(first, tmp_path / "m0")
    assert (tmp_path / "m0" / "model.safetensors").exists()


@pytest.mark.parametrize("fault", ["wrong_credentials", "unreachable"])
def test_s3_fault_registers_nothing(fault, cfg, tiny_model_dir, monkeypatch):
    parent = PipelineRun.start(cfg.tracking, "r").run_id
    if fault == "wrong_credentials":
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
        expected = storage.S3AuthError
    else:
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:9")  # nothing listens
        expected = storage.S3UnreachableError
    with pytest.raises(expected, match="AWS_"):
        tasks.register(cfg, parent, "r", 0, str(tiny_model_dir), METRICS)
    assert registered(cfg) == []
    assert connect(cfg.tracking).get_run(parent).data.metrics == {}


def test_interrupted_checkpoint_upload_is_not_registered_and_rerun_completes(
    cfg, tiny_model_dir, monkeypatch
):
    parent = PipelineRun.start(cfg.tracking, "r").run_id
    real_put, calls = storage._S3Store.put, []

    def dies_after_one_file(self, local, entry):  # a pod killed mid-upload
        calls.append(entry.path)
        if len(calls) > 1:
            raise ConnectionResetError("injected: connection lost mid-upload")
        real_put(self, local, entry)

    monkeypatch.setattr(storage._S3Store, "put", dies_after_one_file)
    with pytest.raises(ConnectionResetError):
        tasks.register(cfg, parent, "r", 0, str(tiny_model_dir), METRICS)
    assert registered(cfg) == []
    with pytest.raises(storage.VerifyError, match="no MANIFEST"):
        storage.verify(f"{cfg.storage.root}/r/0/checkpoint")
    monkeypatch.setattr(storage._S3Store, "put", real_put)
    assert tasks.register(cfg, parent, "r", 0, str(tiny_model_dir), METRICS).version == "1"


def test_mlflow_unreachable_stops_the_run_at_start(cfg):
    down = cfg.model_copy(
        update={"tracking": TrackingConfig(tracking_uri="http://127.0.0.1:9", probe_timeout=1)}
    )
    with pytest.raises(TrackingUnavailableError, match="MLFLOW_TRACKING_URI"):
        tasks.start(down, "job")


def test_eval_report_inlines_the_plot(tmp_path):
    from sparring.evaluate import plot_rewards

    metrics = {"eval/selfplay/player_a/normalized_reward": 0.5}
    plot = plot_rewards(metrics, tmp_path / "r.png")
    transcripts = tmp_path / "t.json"
    transcripts.write_text(
        '{"selfplay": [{"game_id": "g<1>", "rewards": [0.5, 0.5], '
        '"transcript": [{"seat": 0, "text": "[accept] <b>"}]}]}'
    )
    page = reports.eval_report(metrics, plot, transcripts, iteration=3)
    assert 'src="data:image/png;base64,iVBOR' in page
    assert "Iteration 3" in page and "&lt;b&gt;" in page and "<b>" not in page


def test_eval_report_shows_agreement_and_quality_apart_and_the_baselines(tmp_path):
    from sparring.evaluate import plot_rewards

    metrics = {
        "eval/selfplay/player_a/normalized_reward": 0.5,
        "eval/selfplay/player_a/normalized_reward_se": 0.25,
        "eval/selfplay/player_a/agreement_rate": 0.625,
        "eval/selfplay/player_a/reward_given_agreement": 0.8,
        "eval/baseline/random-deal": 0.7,
        "eval/baseline/random-deal_se": 0.01,
        "eval/gain_over_best_trivial": -0.2,
        "eval/gain_over_best_trivial_se": 0.05,
    }
    transcripts = tmp_path / "t.json"
    transcripts.write_text('{"selfplay": []}')
    page = reports.eval_report(metrics, plot_rewards(metrics, tmp_path / "r.png"), transcripts, 1)
    row = "<td>selfplay</td><td>player_a</td><td>0.5 ± 0.25</td><td>0.625</td><td>0.8</td>"
    assert "<th>normalized_reward</th><th>agreement_rate</th>" in page and row in page
    assert "<td>random-deal</td><td>0.700 ± 0.010</td>" in page
    assert "gain over the best trivial baseline: -0.200 ± 0.050" in page
    assert "baseline" not in reports.eval_report(  # a game without baselines: no table
        {"eval/selfplay/all/normalized_reward": 0.5}, tmp_path / "r.png", transcripts, 1
    )


def test_diplomacy_runs_through_every_pipeline_step(tiny_model_dir, tmp_path, mlflow_db):
    """`game: diplomacy` with country grouping: game-init, rollout (per-country metrics),
    GRPO on the `country` key, evaluation against the bots, registration."""
    pytest.importorskip("diplomacy")
    cfg = PipelineConfig.model_validate(
        {
            "game": {"name": "diplomacy", "params": {"horizon": 1, "press": False}},
            "games_per_iteration": 4,
            "device": "cpu",
            "game_init": {"num_train": 2, "num_val": 1},
            "rollout": {"games_per_init": 2, "sampling": {"max_new_tokens": 12}},
            "eval": {
                "modes": ["selfplay", "vs_scripted"],
                "rollout": {"sampling": {"max_new_tokens": 12}},
            },
            "train": {
                "group_key": "country",
                "lr": 1e-4,
                "mini_batch_size": 28,
                "micro_batch_size": 14,
            },
            "storage": {"root": (tmp_path / "store").as_uri()},
            "tracking": {
                "tracking_uri": mlflow_db,
                "experiment": "dip",
            },
            "registered_model": "dip-model",
        }
    )
    inits = tasks.game_init(cfg, tmp_path / "inits", "r")
    stats = tasks.rollout(cfg, str(tiny_model_dir), str(inits["train"]), 0, 4, tmp_path / "ro", "r")
    assert stats["rollout/games"] == 4
    assert stats["rollout/country/FRANCE/games"] == 4  # self-play: every country, every game
    metrics = tasks.train(
        cfg, str(tiny_model_dir), str(tmp_path / "ro/samples.parquet"), tmp_path / "m1"
    )
    groups = metrics["train/country/num_groups"]  # a power with no units left writes no sample
    assert groups == 7
    assert groups * metrics["train/country/mean_group_size"] == metrics["train/samples"]
    ev, report = tasks.evaluate(
        cfg, str(tmp_path / "m1"), str(tiny_model_dir), str(inits["val"]), tmp_path / "ev", "r", 0
    )
    assert {"eval/vs_hold/TURKEY/normalized_reward", cfg.champion_metric} <= set(ev)
    parent = PipelineRun.start(cfg.tracking, "r").run_id
    done = tasks.register(cfg, parent, "r", 0, str(tmp_path / "m1"), stats | metrics | ev)
    assert done.version == "1" and storage.verify(done.checkpoint_uri, deep=True)


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_diplomacy_opponent_mix_follows_and_carries_the_schedule(tiny_model_dir, tmp_path):
    """`opponents.selfplay_fraction: 0.5`: one of two states is self-play, the other seats the
    learner in one country against the scheduled bot; that country's level moves with its
    rewards, and the next rollout continues the schedule: from the schedule.json it is given
    (the pipeline's artifact) or else from the one stored by the previous iteration."""
    pytest.importorskip("diplomacy")
    cfg = PipelineConfig.model_validate(
        {
            "game": {"name": "diplomacy", "params": {"horizon": 1, "press": False}},
            "games_per_iteration": 4,
            "device": "cpu",
            "game_init": {"num_train": 4, "num_val": 1},
            "rollout": {"games_per_init": 2, "sampling": {"max_new_tokens": 8}},
            "opponents": {
                "selfplay_fraction": 0.5,
                "difficulty": {  # every window moves up
                    "pool": ["hold", "random-legal", "greedy"],
                    "window": 1,
                    "raise_above": -1.0,
                    "lower_below": -1.0,
                },
            },
            "storage": {"root": (tmp_path / "store").as_uri()},
        }
    )
    train = str(tasks.game_init(cfg, tmp_path / "inits", "r")["train"])
    stats = tasks.rollout(cfg, str(tiny_model_dir), train, 0, 4, tmp_path / "ro0", "r")
    plan = read_jsonl(tmp_path / "ro0/seat_plan.jsonl")
    assert [row["mode"] for row in plan].count("selfplay") == 1
    games = read_jsonl(tmp_path / "ro0/games.jsonl")
    roles = games[0]["roles"]
    for row in plan:  # both plays of each state are seated as planned
        seats = [
            "policy" if row["mode"] == "selfplay" or r == row["learner_role"] else "hold"
            for r in roles
        ]
        assert [g["seat_policies"] for g in games if g["init_id"] == row["init_id"]] == [seats] * 2
    country = next(row["learner_role"] for row in plan if row["mode"] == "vs_pool")
    assert stats[f"difficulty/{country}"] == 1.0  # up from `hold` to `random-legal`
    saved = json.loads((tmp_path / "ro0/schedule.json").read_text())
    assert saved["levels"] == {country: 1} and saved["history"][0]["iteration"] == 0
    assert storage.verify(f"{cfg.storage.root}/r/0/rollout")  # uploaded with the rollout

    again = tasks.rollout(
        cfg,
        str(tiny_model_dir),
        train,
        1,
        4,
        tmp_path / "ro1",
        "r",
        schedule=tmp_path / "ro0/schedule.json",
    )
    carried = json.loads((tmp_path / "ro1/schedule.json").read_text())
    assert carried["history"][: len(saved["history"])] == saved["history"]
    assert carried["history"][-1]["iteration"] == 1 and again[f"difficulty/{country}"] >= 1.0
    (mixed,) = [r for r in read_jsonl(tmp_path / "ro1/seat_plan.jsonl") if r["mode"] == "vs_pool"]
    assert mixed["level"] == saved["levels"].get(mixed["learner_role"], 0)
    # no schedule given (a campaign block's first rollout): the one stored by iteration 1
    tasks.rollout(cfg, str(tiny_model_dir), train, 2, 4, tmp_path / "ro2", "r")
    resumed = json.loads((tmp_path / "ro2/schedule.json").read_text())
    assert resumed["history"][: len(carried["history"])] == carried["history"]


@pytest.mark.parametrize("layout", ["checkpoint-prefix", "artifact-proxy"])
def test_past_checkpoint_opponents_load_the_right_iterations_model(
    layout, request, tiny_model_dir, tmp_path, monkeypatch
):
    """A pool of `past-1` only, every state against it: rollout 0 stores its model as the run's
    initial one and seats it; rollout 2 loads the checkpoint iteration 0 registered (the policy
    of rollout 1), not iteration 1's, and seat_plan.jsonl names what each resolved to. Both
    places `register` stores a checkpoint: `<root>/<run>/<i>/checkpoint` (sqlite tracking), and
    its logged model's folder behind a real MLflow server's artifact proxy."""
    pytest.importorskip("diplomacy")
    tag = uuid.uuid4().hex[:6]
    if layout == "checkpoint-prefix":
        store = {"root": (tmp_path / "store").as_uri()}
        tracking = {"tracking_uri": request.getfixturevalue("mlflow_db")}
    else:
        for key, value in request.getfixturevalue("s3_server").env().items():
            monkeypatch.setenv(key, value)
        store = {"root": f"s3://sparring/league-{tag}"}
        server = request.getfixturevalue("mlflow_server")
        tracking = {"tracking_uri": server.url, "artifacts_destination": "s3://sparring"}
    cfg = PipelineConfig.model_validate(
        {
            "game": {"name": "diplomacy", "params": {"horizon": 1, "press": False}},
            "games_per_iteration": 2,
            "device": "cpu",
            "game_init": {"num_train": 2, "num_val": 1},
            "rollout": {"games_per_init": 1, "sampling": {"max_new_tokens": 8}},
            "opponents": {"selfplay_fraction": 0.0, "difficulty": {"pool": ["past-1"]}},
            "storage": store,
            "tracking": {**tracking, "experiment": f"league-{tag}"},
            "registered_model": f"league-{tag}",
        }
    )
    root = cfg.storage.root
    train = str(tasks.game_init(cfg, tmp_path / "inits", "r")["train"])

    def seated(out: Path) -> tuple[set, list]:
        plan = {(r["opponent"], r["opponent_model"]) for r in read_jsonl(out / "seat_plan.jsonl")}
        games = [sorted(g["seat_policies"]) for g in read_jsonl(out / "games.jsonl")]
        return plan, games

    tasks.rollout(cfg, str(tiny_model_dir), train, 0, 2, tmp_path / "ro0", "r")
    assert seated(tmp_path / "ro0") == (
        {("past-1", f"{root}/r/initial")},
        [["past-1"] * 6 + ["policy"]] * 2,
    )
    stored = storage.verify(f"{root}/r/initial", deep=True)
    assert stored == storage.scan_dir(tiny_model_dir)  # the learner's model of iteration 0

    # register stores and registers iteration 0's checkpoint, then iteration 1's (other files)
    parent = PipelineRun.start(cfg.tracking, "r").run_id
    scores = {cfg.champion_metric: 0.5}
    first = tasks.register(cfg, parent, "r", 0, str(tiny_model_dir), scores)
    shutil.copytree(tiny_model_dir, tmp_path / "ckpt1")
    (tmp_path / "ckpt1" / "README").write_text("the learner of rollout 2, not its past-1")
    second = tasks.register(cfg, parent, "r", 1, str(tmp_path / "ckpt1"), scores)
    if layout == "checkpoint-prefix":
        assert first.checkpoint_uri == f"{root}/r/0/checkpoint"
    else:  # in the logged model's folder, not under the run's storage root
        assert first.checkpoint_uri.startswith("s3://sparring/mlflow/")
    assert second.checkpoint_uri != first.checkpoint_uri
    tasks.rollout(cfg, str(tiny_model_dir), train, 2, 2, tmp_path / "ro2", "r")
    assert seated(tmp_path / "ro2") == (
        {("past-1", first.checkpoint_uri)},
        [["past-1"] * 6 + ["policy"]] * 2,
    )


# ---- run identity, retried start, stale parents, a quote in the display name ------------------
def test_start_keys_storage_on_the_run_id_and_a_retry_reuses_the_parent(cfg):
    job = str(uuid.uuid4())
    ui = cfg.kubernetes.model_copy(update={"kfp_ui_url": "https://kubeflow.example/pipeline/"})
    cfg = cfg.model_copy(update={"kubernetes": ui})
    name, parent = tasks.start(cfg, job, "it's nightly")
    assert name == job and tasks.start(cfg, job, "it's nightly") == (job, parent)
    run = connect(cfg.tracking).get_run(parent)
    assert run.data.tags["kfp.run_name"] == "it's nightly" and run.info.run_name == "it's nightly"
    assert run.data.tags["kfp.run_url"] == f"https://kubeflow.example/pipeline/#/runs/details/{job}"
    summary = tasks.finish(cfg, job, "it's nightly")
    assert "## it's nightly: FINISHED" in summary and parent in summary
    assert connect(cfg.tracking).get_run(parent).info.status == "FINISHED"


def test_start_closes_parent_runs_older_than_the_run_deadline(cfg):
    client = connect(cfg.tracking)
    tasks.start(cfg, "first", "a")  # creates the experiment
    experiment = client.get_experiment_by_name(cfg.tracking.experiment).experiment_id
    old = int((time.time() - cfg.kubernetes.run_deadline_seconds - 60) * 1000)
    stale = client.create_run(experiment, start_time=old, tags={runs.PIPELINE_TAG: cfg.name})
    live = runs.find_parent(cfg, client, "first")
    tasks.start(cfg, "second", "b")
    assert client.get_run(stale.info.run_id).info.status == "KILLED"
    assert client.get_run(live.info.run_id).info.status == "RUNNING"  # within its deadline


# ---- 6. models from S3 on the configured endpoint ---------------------------------------------
def test_an_s3_model_loads_from_the_configured_endpoint_alone(
    cfg, s3_server, tiny_model_dir, tmp_path, monkeypatch
):
    uri = f"{cfg.storage.root}/seed/checkpoint"
    storage.upload_dir(tiny_model_dir, uri)
    for key in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):  # a pod gets only the two keys
        monkeypatch.delenv(key)
    monkeypatch.setenv("SPARRING_MODEL_CACHE", str(tmp_path / "cache"))
    first = cfg.model_copy(
        update={
            "model": uri,
            "storage": cfg.storage.model_copy(update={"endpoint_url": s3_server.endpoint_url}),
        }
    )
    tasks.initial_model(first, tmp_path / "m0")
    assert (tmp_path / "m0" / "model.safetensors").exists()


def test_the_start_evaluation_opens_the_run_summary(cfg, tiny_model_dir, tmp_path):
    """The start's evaluation (before any update; no register step follows it) is recorded
    as iteration -1, so the summary table starts there; its per-game scores are written."""
    data = {k: cfg.model_dump(mode="json")[k] for k in ("storage", "tracking", "registered_model")}
    start = PipelineConfig.model_validate(
        data
        | {
            "game": {"params": {"k": 3, "max_turns": 2}},
            "device": "cpu",
            "game_init": {"num_train": 1, "num_val": 2},
            "eval": {"modes": ["selfplay"], "rollout": {"sampling": {"max_new_tokens": 8}}},
        }
    )
    inits = tasks.game_init(start, tmp_path / "inits", "r")
    parent = PipelineRun.start(start.tracking, "r").run_id
    ev, _ = tasks.evaluate(
        start, str(tiny_model_dir), None, str(inits["val"]), tmp_path / "ev", "r", -1, parent
    )
    scores = tasks.load_scores(tmp_path / "ev")
    assert sorted(scores) == [
        "val-000000/selfplay/policy/all#0",
        "val-000001/selfplay/policy/all#0",
    ]
    assert sum(scores.values()) / 2 == pytest.approx(ev[start.champion_metric])
    (row,) = reports.summary_rows(start, parent, connect(start.tracking))
    assert (row["iteration"], row["score"], row["version"]) == (-1, ev[start.champion_metric], "-")
    summary = reports.run_summary(start, "r", "FINISHED", [row], None, {})
    assert f"| start | nan | {ev[start.champion_metric]:.3f} | - |" in summary


def test_kuhn_exploiter_plays_the_best_response_to_the_learner(tiny_model_dir, tmp_path):
    """`opponents` with `kuhn-poker-exploiter` and no self-play: every game seats the learner
    against the exploiter, and each of the exploiter's moves is the best response (open_spiel's)
    to the learner's readout at the rollout's temperature, at that move's information state."""
    pytest.importorskip("textarena")
    pytest.importorskip("pyspiel")
    from sparring.games.textarena import exploitability as kuhn
    from sparring.generation.hf import HFBackend

    cfg = PipelineConfig.model_validate(
        {
            "game": {"name": "kuhn-poker", "params": {"max_rounds": 1, "restate_card": True}},
            "games_per_iteration": 8,
            "device": "cpu",
            "game_init": {"num_train": 4, "num_val": 1},
            "rollout": {
                "games_per_init": 2,
                "choose_legal": True,
                "sampling": {"temperature": 0.7, "max_new_tokens": 8},
            },
            "opponents": {
                "selfplay_fraction": 0.0,
                "difficulty": {"pool": ["kuhn-poker-exploiter"]},
            },
            "storage": {"root": (tmp_path / "store").as_uri()},
        }
    )
    train = str(tasks.game_init(cfg, tmp_path / "inits", "r")["train"])
    tasks.rollout(cfg, str(tiny_model_dir), train, 0, 8, tmp_path / "ro", "r")
    learner = HFBackend(str(tiny_model_dir), device="cpu")
    best = kuhn.best_response(kuhn.read_policy(learner, cfg.game.make(), temperature=0.7))
    games, moves = read_jsonl(tmp_path / "ro/games.jsonl"), 0
    assert len(games) == 8
    for played in games:
        assert sorted(played["seat_policies"]) == ["kuhn-poker-exploiter", "policy"]
        seat = played["seat_policies"].index("kuhn-poker-exploiter")
        game = cfg.game.make()
        game.reset(played["state"])
        for turn in played["transcript"]:
            if turn["seat"] == seat:
                action = kuhn.MOVES[turn["text"].strip("[]")]
                assert best[kuhn.info_state(game, seat)][action] == 1.0
                moves += 1
            game.step(turn["seat"], turn["text"])
    assert moves >= 8  # each game: the exploiter moves at least once


def test_a_uniform_draw_seats_every_pool_opponent_in_one_rollout(tiny_model_dir, tmp_path):
    """`draw: uniform` mixes the exploiter (a learner agent, built from the learner's table)
    with a random player in one rollout; every play of a state meets the same opponent."""
    pytest.importorskip("textarena")
    pytest.importorskip("pyspiel")
    pool = ["kuhn-poker-exploiter", "kuhn-poker-random"]
    cfg = PipelineConfig.model_validate(
        {
            "game": {"name": "kuhn-poker", "params": {"max_rounds": 1, "restate_card": True}},
            "games_per_iteration": 16,
            "device": "cpu",
            "game_init": {"num_train": 8, "num_val": 1},
            "rollout": {"games_per_init": 2, "choose_legal": True},
            "opponents": {
                "selfplay_fraction": 0.0,
                "difficulty": {"pool": pool, "draw": "uniform"},
            },
            "storage": {"root": (tmp_path / "store").as_uri()},
        }
    )
    train = str(tasks.game_init(cfg, tmp_path / "inits", "r")["train"])
    tasks.rollout(cfg, str(tiny_model_dir), train, 0, 16, tmp_path / "ro", "r")
    met: dict[str, set[str]] = {}
    for played in read_jsonl(tmp_path / "ro/games.jsonl"):
        (opponent,) = set(played["seat_policies"]) - {"policy"}
        met.setdefault(json.dumps(played["state"], sort_keys=True), set()).add(opponent)
    assert len(met) == 8 and all(len(names) == 1 for names in met.values())
    assert set().union(*met.values()) == set(pool)
    rows = read_jsonl(tmp_path / "ro/seat_plan.jsonl")
    assert sorted(r["opponent"] for r in rows) == sorted(n for v in met.values() for n in v)


def test_the_model_plays_on_the_evaluations_own_engine(tiny_model_dir, tmp_path):
    """`eval.rollout.backend` picks the evaluated model's engine (it was once always the fp32
    hf engine): an OpenAI-compatible server that is not there fails with its address, in the
    pipeline's evaluation task and in `sparring evaluate`."""
    from sparring.evaluate import EvalConfig, load_and_evaluate
    from sparring.game_init import GameInitConfig, write_inits
    from sparring.generation.openai import ServerError

    game = {"params": {"k": 3, "max_turns": 2}}
    val = write_inits(GameInitConfig(game=game, num_train=1, num_val=1), tmp_path)["val"]
    backend = {"name": "openai", "base_url": "http://127.0.0.1:9", "retries": 0}
    ecfg = EvalConfig(rollout={"game": game, "backend": backend})
    cfg = PipelineConfig.model_validate({"model": str(tiny_model_dir), "device": "cpu"})
    with pytest.raises(ServerError, match="127.0.0.1:9"):
        tasks._play_eval(cfg, ecfg, str(tiny_model_dir), None, val)
    with pytest.raises(ServerError, match="127.0.0.1:9"):
        load_and_evaluate(str(tiny_model_dir), val, ecfg, progress=False)
