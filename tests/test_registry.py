"""The registry as a downstream user meets it: a real `mlflow server --serve-artifacts` whose
artifact destination is a real SeaweedFS bucket, the tiny model trained by the pipeline's own
train step, and a fresh Python process with only MLFLOW_TRACKING_URI that loads the champion
with MLflow's transformers and pyfunc loaders. Mocks only inject crashes a real run can't
produce on demand."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from unittest import mock

import mlflow
import pytest
import torch
from mlflow.exceptions import MlflowException
from safetensors.torch import load_file
from sample_frames import make_samples
from test_storage import recording_put
from transformers import AutoModelForCausalLM, AutoTokenizer

from sparring import registry, storage
from sparring.dev.mlflowserver import MlflowServer
from sparring.games import make_game
from sparring.loop import tasks
from sparring.loop.config import PipelineConfig
from sparring.loop.io import run_uri, upload
from sparring.registry import MODEL_ID_TAG, NotRegisteredError, champion
from sparring.storage import _S3Store
from sparring.tracking import CHECKPOINT_TAG, PipelineRun, TrackingConfig, connect

EVALS = {"eval/selfplay/all/normalized_reward": 0.5, "eval/vs_scripted/all/normalized_reward": 0.25}
NEW_TOKENS = 6


@pytest.fixture
def cfg(s3_server, mlflow_server, tiny_model_dir, monkeypatch) -> PipelineConfig:
    for key, value in s3_server.env().items():
        monkeypatch.setenv(key, value)
    tag = uuid.uuid4().hex[:6]
    return PipelineConfig.model_validate(
        {
            "game": {"params": {"k": 3}},
            "model": str(tiny_model_dir),
            "device": "cpu",
            "storage": {"root": f"s3://sparring/registry-{tag}"},
            "tracking": {
                "tracking_uri": mlflow_server.url,
                "experiment": f"registry-{tag}",
                "artifacts_destination": "s3://sparring",
            },
            "train": {
                "group_key": "batch",
                "param_dtype": "bfloat16",
                "mini_batch_size": 2,
                "micro_batch_size": 1,
            },
            "registered_model": f"registry-{tag}",
            "champion_metric": "eval/selfplay/all/normalized_reward",
        }
    )


def trained_iteration(cfg: PipelineConfig, tmp_path: Path, run: str) -> tuple[str, Path]:
    """A parent run, game-init and samples in storage, and one GRPO step of the tiny model
    logged live to MLflow: (parent run id, the trained checkpoint)."""
    parent = PipelineRun.start(cfg.tracking, run).run_id
    tasks.game_init(cfg, tmp_path / "inits", run)
    (tmp_path / "rollout").mkdir()
    samples = tmp_path / "rollout" / "samples.parquet"
    make_samples(AutoTokenizer.from_pretrained(cfg.model), [1.0, 0.0, 0.5, 0.25]).to_parquet(
        samples
    )
    upload(cfg, tmp_path / "rollout", run_uri(cfg, run, 0, "rollout"))
    out = tmp_path / "trained"
    metrics = tasks.train(cfg, cfg.model, str(samples), out, parent_run_id=parent, iteration=0)
    assert metrics["train/no_signal"] == 0 and metrics["train/optimizer_steps"] == 2
    return parent, out


def tensors_digest(state: dict[str, torch.Tensor]) -> dict[str, list]:
    """name -> [dtype, sha256 of the raw bytes] for every tensor."""
    import hashlib

    return {
        k: [str(t.dtype), hashlib.sha256(t.contiguous().view(torch.uint8).numpy()).hexdigest()]
        for k, t in sorted(state.items())
    }


LOADER = """
import hashlib, json, os, sys
import mlflow, torch
uri, messages, n = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
assert set(os.environ) & {"AWS_ACCESS_KEY_ID", "AWS_ENDPOINT_URL", "MLFLOW_S3_ENDPOINT_URL"} == set()
chat = mlflow.transformers.load_model(uri)
reply = chat(messages, max_new_tokens=n, do_sample=False)[0]["generated_text"][-1]
digest = {k: [str(t.dtype), hashlib.sha256(t.contiguous().view(torch.uint8).numpy()).hexdigest()]
          for k, t in sorted(chat.model.state_dict().items())}
out = mlflow.pyfunc.load_model(uri).predict({"messages": messages, "max_tokens": n})[0]
print(json.dumps({"reply": reply, "digest": digest, "pyfunc": out}))
"""


def test_champion_loads_through_the_server_alone(cfg, mlflow_server, s3_server, tmp_path):
    run = "r-" + uuid.uuid4().hex[:6]
    parent, trained = trained_iteration(cfg, tmp_path, run)
    client = connect(cfg.tracking)
    child = PipelineRun.attach(parent, cfg.tracking).iteration_run(0)

    # live curve: one point per optimizer step, logged by the train step itself
    for name in ("loss", "grad_norm", "lr", "entropy", "pg_clipfrac", "tokens_per_second"):
        assert [m.step for m in client.get_metric_history(child, f"train_step/{name}")] == [0, 1]

    done = tasks.register(cfg, parent, run, 0, str(trained), EVALS, kfp_run_id="kfp-run-1")
    # a retried register task finds its version: no duplicate
    again = tasks.register(cfg, parent, run, 0, str(trained), EVALS, kfp_run_id="kfp-run-1")
    assert again == done and done.version == "1"
    assert len(client.search_model_versions(f"name = '{cfg.registered_model}'")) == 1
    version = client.get_model_version(cfg.registered_model, "1")
    # stored once, in the logged model's own folder, which the server proxies
    model = client.get_logged_model(version.tags[MODEL_ID_TAG])
    assert version.source == f"models:/{model.model_id}"
    uri = version.tags[CHECKPOINT_TAG]
    assert uri == "s3://sparring/" + model.artifact_location.removeprefix("mlflow-artifacts:/")
    assert done.checkpoint_uri == uri
    tags = {k: version.tags[k] for k in ("parent_run_id", "kfp_run_id", "group_key", "game")}
    assert tags == {
        "parent_run_id": parent,
        "kfp_run_id": "kfp-run-1",
        "group_key": "batch",
        "game": "matching",
    }
    assert "| eval/selfplay/all/normalized_reward | 0.5000 |" in version.description
    assert f'mlflow.pyfunc.load_model("models:/{cfg.registered_model}/1")' in version.description

    # the version is linked to a READY logged model carrying the eval metrics as numbers
    assert model.status == "READY" and model.source_run_id == child
    assert {m.key: m.value for m in model.metrics} == EVALS
    # lineage: the game-init split and the samples, with their stored sha256 as digest
    inputs = client.get_run(child).inputs.dataset_inputs
    digests = {e.path: e.sha256 for e in storage.verify(run_uri(cfg, run, "inits"))}
    assert {d.dataset.name: d.dataset.digest for d in inputs} == {
        "game-init-train": digests["train.parquet"][:36],
        "samples-0": storage.verify(run_uri(cfg, run, 0, "rollout"))[0].sha256[:36],
    }
    # the weights are stored once: the stored checkpoint is the MLflow model
    stored = {e.path for e in storage.verify(uri, deep=True)}
    assert {"MLmodel", "model.safetensors", "components/tokenizer/tokenizer.json"} <= stored
    experiment = model.artifact_location.removeprefix("mlflow-artifacts:/").split("/models/")[0]
    ours = (cfg.storage.root.removeprefix("s3://sparring/"), experiment + "/")
    listing = s3_server.client().list_objects_v2(Bucket="sparring")["Contents"]
    weights = [o["Key"] for o in listing if o["Key"].endswith(".safetensors")]
    weights = [k for k in weights if k.startswith(ours)]
    assert weights == [f"{uri.removeprefix('s3://sparring/')}/model.safetensors"]

    # a fresh process with only MLFLOW_TRACKING_URI: both loaders, the matching game's chat
    game = make_game("matching", k=3)
    game.reset(game.generate_state(0))
    messages = game.messages(0)
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "MLFLOW_TRACKING_URI": mlflow_server.url,
    }
    env["HF_HUB_OFFLINE"] = "1"
    champion = f"models:/{cfg.registered_model}@champion"
    proc = subprocess.run(
        [sys.executable, "-c", LOADER, champion, json.dumps(messages), str(NEW_TOKENS)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])

    # same weights, same dtype, bit for bit, as the checkpoint the train step wrote
    saved = tensors_digest(load_file(trained / "model.safetensors"))
    assert {k: got["digest"][k] for k in saved} == saved
    assert {d for d, _ in got["digest"].values()} == {"torch.bfloat16"}  # the training dtype
    # the pipeline replies with what the trained policy generates greedily under the chat template
    tok = AutoTokenizer.from_pretrained(trained)
    prompt = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt")
    ids = prompt["input_ids"] if hasattr(prompt, "keys") else prompt
    policy = AutoModelForCausalLM.from_pretrained(trained, dtype=torch.bfloat16)
    out = policy.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False)
    expected = tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
    assert got["reply"] == {"role": "assistant", "content": expected}
    assert got["pyfunc"]["object"] == "chat.completion"
    assert got["pyfunc"]["choices"][0]["message"]["role"] == "assistant"
    assert got["pyfunc"]["usage"]["completion_tokens"] <= NEW_TOKENS


@pytest.fixture
def sqlite_cfg(cfg, mlflow_db) -> PipelineConfig:
    """`cfg` on a sqlite store (no server: checkpoints go to the pipeline's checkpoint URI)."""
    tracking = {"tracking_uri": mlflow_db, "experiment": "faults"}
    return cfg.model_copy(update={"tracking": TrackingConfig(**tracking)})


def test_half_written_logged_model_is_never_registered(sqlite_cfg, tiny_model_dir):
    cfg, client = sqlite_cfg, connect(sqlite_cfg.tracking)
    parent = PipelineRun.start(cfg.tracking, "r").run_id
    with (
        mock.patch.object(_S3Store, "put", recording_put(_S3Store.put, [], fail_at=2)),
        pytest.raises(ConnectionError),
    ):
        tasks.register(cfg, parent, "r", 0, str(tiny_model_dir), EVALS)
    assert client.search_model_versions(f"name = '{cfg.registered_model}'") == []
    (pending,) = client.search_logged_models([client.get_run(parent).info.experiment_id])
    assert pending.status == "PENDING"
    with pytest.raises(NotRegisteredError, match="PENDING, not READY"):
        registry.ready_model_id(client, pending.model_id)
    with pytest.raises(storage.VerifyError, match="incomplete"):  # no manifest: not a checkpoint
        storage.verify(run_uri(cfg, "r", 0, "checkpoint"))

    done = tasks.register(cfg, parent, "r", 0, str(tiny_model_dir), EVALS)  # the retry
    assert (done.version, done.champion_version) == ("1", "1")
    (model,) = client.search_logged_models([client.get_run(parent).info.experiment_id])
    assert (model.model_id, model.status) == (pending.model_id, "READY")
    assert done.checkpoint_uri == run_uri(cfg, "r", 0, "checkpoint")
    assert client.get_model_version(cfg.registered_model, "1").source == done.checkpoint_uri


def test_missing_checkpoint_and_wrong_credentials_register_nothing(
    sqlite_cfg, tmp_path, tiny_model_dir, monkeypatch
):
    cfg, client = sqlite_cfg, connect(sqlite_cfg.tracking)
    parent = PipelineRun.start(cfg.tracking, "r").run_id
    with pytest.raises(OSError):
        tasks.register(cfg, parent, "r", 0, str(tmp_path / "missing"), EVALS)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    with pytest.raises(storage.S3AuthError):
        tasks.register(cfg, parent, "r", 0, str(tiny_model_dir), EVALS)
    assert client.search_model_versions(f"name = '{cfg.registered_model}'") == []


def test_champion_is_a_compare_and_set(sqlite_cfg, tiny_model_dir):
    cfg, client = sqlite_cfg, connect(sqlite_cfg.tracking)
    parent = PipelineRun.start(cfg.tracking, "r").run_id
    metric = cfg.champion_metric
    moves = [
        tasks.register(cfg, parent, "r", i, str(tiny_model_dir), {**EVALS, metric: score})
        for i, score in enumerate([0.3, 0.5, 0.5, 0.4])
    ]
    assert [m.champion_version for m in moves] == ["1", "2", "2", "2"]  # ties keep it
    # a decision made against v1 while another register moved it to v2 changes nothing
    assert not registry.move_champion(client, cfg.registered_model, "4", expected="1")
    assert registry.move_champion(client, cfg.registered_model, "4", expected="2")
    assert champion(cfg.registered_model, client).version == 4


def test_the_champion_moves_only_on_a_paired_gain_beyond_its_standard_error(cfg, tiny_model_dir):
    """Scores per val game, the same 4 games each time (a real server keeps them as run
    artifacts, which the next register reads back)."""
    client, metric = connect(cfg.tracking), cfg.champion_metric
    parent = PipelineRun.start(cfg.tracking, "r").run_id

    def register(i: int, scores: dict[str, float]) -> tasks.Registered:
        evals = {**EVALS, metric: sum(scores.values()) / len(scores)}
        return tasks.register(cfg, parent, "r", i, str(tiny_model_dir), evals, scores=scores)

    first = {"g0": 0.5, "g1": 0.2, "g2": 0.8, "g3": 0.4}  # mean .475
    assert register(0, first).champion_version == "1"
    # noise: differences +.3 -.1 +.2 -.2, mean +.05; deviations ±.25 ±.15, so
    # s.d. = sqrt((2 * .0625 + 2 * .0225) / 3) = .238, s.e. = .238 / 2 = .119 > .05: it stays,
    # though the mean score is higher (.525 > .475)
    noisy = {"g0": 0.8, "g1": 0.1, "g2": 1.0, "g3": 0.2}
    assert register(1, noisy).champion_version == "1"
    # a real gain: differences +.1 +.15 +.1 +.05, mean +.1; s.d. = sqrt(.005 / 3) = .0408,
    # s.e. = .0204 < .1: it moves
    better = {"g0": 0.6, "g1": 0.35, "g2": 0.9, "g3": 0.45}
    assert register(2, better).champion_version == "3"
    assert registry.improves(0.5, None, 0.4, None)  # no per-game scores: the higher score
    # a run scored by another evaluation (other val states) can't be compared: refused
    other = cfg.model_copy(update={"game_init": cfg.game_init.model_copy(update={"num_val": 9})})
    with pytest.raises(ValueError, match="scored by another evaluation"):
        tasks.register(other, parent, "r", 3, str(tiny_model_dir), EVALS, scores=first)
    assert len(client.search_model_versions(f"name = '{cfg.registered_model}'")) == 3


@pytest.fixture(scope="module")
def auth_server(s3_server, tmp_path_factory):
    """`mlflow_server` behind MLflow's basic-auth app (the chart's `mlflow.auth.enabled`)."""
    admin = ("sparring-admin", "pw-" + uuid.uuid4().hex)
    workdir = tmp_path_factory.mktemp("mlflow-auth")
    with MlflowServer(workdir, "s3://sparring", s3_server.env(), admin) as server:
        yield server


def test_basic_auth_needs_the_login_which_never_reaches_mlflow_or_logs(
    cfg, auth_server, s3_server, tiny_model_dir, tmp_path, monkeypatch, capfd
):
    tracking = cfg.tracking.model_copy(update={"tracking_uri": auth_server.url})
    cfg = cfg.model_copy(update={"tracking": tracking})
    monkeypatch.setenv("MLFLOW_TRACKING_URI", auth_server.url)
    with pytest.raises(MlflowException, match="401"):  # no login, no run
        tasks.start(cfg, "job-0", "job")
    user, password = auth_server.admin
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", user)
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", password)
    parent = tasks.start(cfg, "job-1", "job")[1]
    tasks.register(cfg, parent, "job-1", 0, str(tiny_model_dir), EVALS)
    # the artifact proxy serves the model to a logged-in client only
    uri = f"models:/{cfg.registered_model}/1"
    got = mlflow.artifacts.download_artifacts(uri, dst_path=str(tmp_path / "dl"))
    assert (Path(got) / "MLmodel").is_file() and (Path(got) / "model.safetensors").is_file()
    client = connect(cfg.tracking)
    secrets = [password, s3_server.secret_key, s3_server.access_key]
    experiment = client.get_run(parent).info.experiment_id
    runs = client.search_runs([experiment])
    seen = [json.dumps([r.data.params, r.data.tags]) for r in runs]
    for v in client.search_model_versions(f"name = '{cfg.registered_model}'"):
        v = client.get_model_version(cfg.registered_model, v.version)
        seen += [json.dumps(v.tags), v.description or ""]
    seen += [json.dumps(m.tags) for m in client.search_logged_models([experiment])]
    seen += [*capfd.readouterr(), auth_server.log_path.read_text()]
    assert len(runs) == 2 and all(s not in text for s in secrets for text in seen)
    monkeypatch.delenv("MLFLOW_TRACKING_PASSWORD")
    with pytest.raises(MlflowException, match="401"):
        mlflow.artifacts.download_artifacts(uri, dst_path=str(tmp_path / "denied"))


def test_the_login_wins_over_the_kfp_mlflow_plugins_injected_auth(
    cfg, auth_server, tiny_model_dir, monkeypatch
):
    """KFP 2.17's MLflow plugin injects MLFLOW_RUN_ID, MLFLOW_EXPERIMENT_ID, its own
    MLFLOW_TRACKING_URI and MLFLOW_TRACKING_AUTH=kubernetes(-namespaced) + MLFLOW_WORKSPACE
    into every task (kubeflow/pipelines backend/src/v2 MLflow plugin). Under that auth MLflow's
    client stops sending the basic-auth login; with the login set, Sparring's tasks drop the
    plugin's auth and log and register as that user; the config's tracking_uri beats the
    plugin's URI, and the plugin's run and experiment are not used."""
    tracking = cfg.tracking.model_copy(update={"tracking_uri": auth_server.url})
    cfg = cfg.model_copy(update={"tracking": tracking})
    user, password = auth_server.admin
    plugin = {
        "MLFLOW_TRACKING_AUTH": "kubernetes-namespaced",
        "MLFLOW_WORKSPACE": "team-a",
        "MLFLOW_TRACKING_URI": "http://mlflow.kubeflow.invalid:8080",
        "MLFLOW_RUN_ID": uuid.uuid4().hex,
        "MLFLOW_EXPERIMENT_ID": "424242",
    }
    for key, value in {**plugin, "MLFLOW_TRACKING_USERNAME": user}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", password)
    # what the plugin's variable does to MLflow's own client: the login is not sent
    with pytest.raises(Exception):  # noqa: B017 - no kube credentials here, or a 401
        mlflow.MlflowClient(auth_server.url).search_experiments()
    parent = tasks.start(cfg, "job-plugin", "job")[1]
    assert "MLFLOW_TRACKING_AUTH" not in os.environ and "MLFLOW_WORKSPACE" not in os.environ
    done = tasks.register(cfg, parent, "job-plugin", 0, str(tiny_model_dir), EVALS)
    client = connect(cfg.tracking)
    run = client.get_run(parent)
    assert run.info.run_id != os.environ["MLFLOW_RUN_ID"]
    assert run.info.experiment_id != plugin["MLFLOW_EXPERIMENT_ID"]
    assert client.get_model_version(cfg.registered_model, done.version).run_id
    # without Sparring's login the plugin's auth is left as it is (a Kubernetes-auth server)
    monkeypatch.delenv("MLFLOW_TRACKING_USERNAME")
    monkeypatch.setenv("MLFLOW_TRACKING_AUTH", "kubernetes")
    from sparring.tracking import _login_over_plugin_auth

    _login_over_plugin_auth()
    assert os.environ["MLFLOW_TRACKING_AUTH"] == "kubernetes"


def run_chart_runner_job(url: str, admin: tuple[str, str], values: dict, tmp_path: Path):
    """The chart's runner Job as rendered with `values`: its command, with the script from the
    pipeline ConfigMap and its env (Secret references resolved from the rendered Secrets), the
    in-cluster MLflow URL replaced by `url`. Returns (the finished process, the runner login)."""
    import base64

    from test_helm import CHART, MINIMAL, Chart, by_kind, render

    auth = {"enabled": True, "adminUsername": admin[0], "adminPassword": admin[1]}
    docs = render(Chart.load(str(CHART)), {**MINIMAL, "mlflow": {"auth": auth}, **values})
    secrets = {
        name: {k: base64.b64decode(v).decode() for k, v in s.get("data", {}).items()}
        for name, s in by_kind(docs, "Secret").items()
    }
    pod = by_kind(docs, "Job")["sparring-mlflow-runner"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {}
    for e in container["env"]:
        ref = e.get("valueFrom", {}).get("secretKeyRef")
        env[e["name"]] = secrets[ref["name"]][ref["key"]] if ref else e["value"]
    env["MLFLOW_TRACKING_URI"] = url
    (volume,) = [v for v in pod["volumes"] if v["name"] == "scripts"]
    (item,) = volume["configMap"]["items"]
    script = tmp_path / item["path"]
    script.write_text(by_kind(docs, "ConfigMap")[volume["configMap"]["name"]]["data"][item["key"]])
    python, path = container["command"]
    assert python == "python" and path.endswith(f"/{item['path']}")
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True)
    return done, (env["RUNNER_USERNAME"], env["RUNNER_PASSWORD"])


def test_the_charts_runner_user_runs_and_registers_but_is_no_admin(
    cfg, auth_server, tiny_model_dir, tmp_path, monkeypatch
):
    """The non-admin MLflow user the chart's runner Job creates (its own script and env, run
    against a real basic-auth server with the chart's default_permission READ) can do what
    pipeline tasks do: start the parent run, log, register a version and move the champion
    alias. It is refused what only the admin may (create users) and what EDIT does not give
    (delete the registered model). Rerunning the Job changes nothing; a MANAGE grant the runner
    picked up (by creating the model itself) goes back to EDIT."""
    from mlflow.server.auth.client import AuthServiceClient

    pipeline = {"experiment": cfg.tracking.experiment, "registeredModel": cfg.registered_model}
    done, login = run_chart_runner_job(
        auth_server.url, auth_server.admin, {"pipeline": pipeline}, tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert "created" in done.stdout and "EDIT granted" in done.stdout
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", auth_server.admin[0])
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", auth_server.admin[1])
    admin = AuthServiceClient(auth_server.url)
    assert not admin.get_user(login[0]).is_admin
    admin.revoke_user_permission(login[0], "registered_model", cfg.registered_model)
    admin.grant_user_permission(login[0], "registered_model", cfg.registered_model, "MANAGE")
    # an offline render draws a new password (a cluster's keeps the Secret's): a rotation
    again, rotated = run_chart_runner_job(
        auth_server.url, auth_server.admin, {"pipeline": pipeline}, tmp_path
    )
    assert again.returncode == 0, again.stderr
    assert "password set" in again.stdout and "EDIT already held" in again.stdout
    assert "EDIT replaced MANAGE" in again.stdout
    assert rotated[0] == login[0] and rotated[1] != login[1]
    login = rotated

    # the pipeline's work, logged in as the runner
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", login[0])
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", login[1])
    tracking = cfg.tracking.model_copy(update={"tracking_uri": auth_server.url})
    cfg = cfg.model_copy(update={"tracking": tracking})
    parent = tasks.start(cfg, "job-runner", "job")[1]
    registered = tasks.register(cfg, parent, "job-runner", 0, str(tiny_model_dir), EVALS)
    client = connect(cfg.tracking)
    champion_version = client.get_model_version_by_alias(cfg.registered_model, "champion")
    assert champion_version.version == registered.version
    # not an admin, not a manager
    runner = AuthServiceClient(auth_server.url)
    with pytest.raises(MlflowException, match="403|PERMISSION_DENIED"):
        runner.create_user("intruder-" + uuid.uuid4().hex[:6], "pw-" + uuid.uuid4().hex)
    with pytest.raises(MlflowException, match="403|PERMISSION_DENIED"):
        client.delete_registered_model(cfg.registered_model)


def documented_loaders() -> list[str]:
    """The python blocks of docs/pipeline.md's registry section, as written."""
    import re

    doc = (Path(__file__).parents[1] / "docs" / "pipeline.md").read_text()
    section = doc.split("## The model registry: three ways to get a model out")[1]
    return re.findall(r"```python\n(.*?)```", section.split("\n## ")[0], re.S)


def test_the_documented_loaders_work_with_only_the_tracking_uri(cfg, mlflow_server, tmp_path):
    blocks = documented_loaders()
    assert len(blocks) == 3 and all("@champion" in b for b in blocks)
    parent = PipelineRun.start(cfg.tracking, "r").run_id
    trained = tmp_path / "ckpt"
    model = AutoModelForCausalLM.from_pretrained(cfg.model, dtype=torch.bfloat16)
    model.save_pretrained(trained)
    AutoTokenizer.from_pretrained(cfg.model).save_pretrained(trained)
    tasks.register(cfg, parent, "r", 0, str(trained), EVALS)
    script = "\n".join(blocks).replace("sparring-matching", cfg.registered_model)
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    env["MLFLOW_TRACKING_URI"] = mlflow_server.url
    proc = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    # both generators replied (printed), and the plain files are the bf16 weights + template
    assert proc.stdout.strip().splitlines()[-1].endswith("torch.bfloat16 True")


# ---- the MLflow model's own files --------------------------------------------------------------


@pytest.mark.parametrize(
    ("image", "flavour"),
    [
        ("ghcr.io/sparring/sparring:0.1.0-gpu", "gpu"),
        ("registry.local:5000/me/sparring:0.1.0-gpu-diplomacy", "gpu"),  # a flavour: its base
        ("ghcr.io/sparring/sparring:0.1.0-cpu", "cpu"),
        ("registry.local:5000/me/custom", None),  # not a Sparring image: this process's stack
        ("", None),  # a local run: trained where it registers
    ],
)
def test_requirements_are_the_trainers_image_stack(image, flavour, monkeypatch):
    from sparring.image_stacks import MODEL_PACKAGES, STACKS

    monkeypatch.setenv(registry.TRAINER_IMAGE_ENV, image)
    here = {p: importlib.metadata.version(p).split("+")[0] for p in MODEL_PACKAGES}
    assert registry.trainer_requirements() == (STACKS[flavour] if flavour else here)


def test_staged_model_has_a_chat_input_example_and_the_gpu_images_requirements(
    tiny_model_dir, tmp_path, monkeypatch
):
    """A model trained on the GPU image and registered from the CPU one pins the GPU image's
    torch and transformers (its lock's), and carries an input example its pyfunc answers."""
    from mlflow.models import Model

    from sparring.image_stacks import STACKS

    monkeypatch.setenv(registry.TRAINER_IMAGE_ENV, "ghcr.io/sparring/sparring:0.1.0-gpu")
    out = registry.stage_mlflow_model(tiny_model_dir, tmp_path / "m")
    gpu = STACKS["gpu"]
    assert gpu["torch"] != torch.__version__.split("+")[0]  # not this (CPU) process's
    pins = dict(line.split("==") for line in (out / "requirements.txt").read_text().split())
    assert pins == gpu
    model = Model.load(out / "MLmodel")
    assert model.flavors["transformers"]["transformers_version"] == gpu["transformers"]
    example = model.load_input_example(str(out))
    assert example == registry.INPUT_EXAMPLE and model.saved_input_example_info
    assert json.loads((out / "serving_input_example.json").read_text()) == registry.INPUT_EXAMPLE
    # the pyfunc (llm/v1/chat) takes it as it is, past its signature
    small = {**example, "max_tokens": 2}
    reply = mlflow.pyfunc.load_model(str(out)).predict(small)[0]
    assert reply["object"] == "chat.completion"
    assert reply["choices"][0]["message"]["role"] == "assistant"
