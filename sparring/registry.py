"""The model registry: every registered version is an MLflow model a downstream user loads.

    reg = publish(client, "sparring-matching", "out/ckpt", run_id=child, iteration=0,
                  metrics={"eval/...": 0.41}, score=0.41, fallback_uri="s3://.../0/checkpoint",
                  artifacts_destination="s3://sparring")
    mlflow.transformers.load_model("models:/sparring-matching@champion")   # a chat pipeline
    mlflow.pyfunc.load_model("models:/sparring-matching@champion")         # llm/v1/chat

A stored checkpoint is both a Hugging Face folder (weights, config and tokenizer at the top,
which the pipeline's steps load) and an MLflow `transformers` model: its `MLmodel` points the
flavour's `model_binary` at that same folder (`.`), and MLflow reads the tokenizer (with its
chat template) from `components/tokenizer`, a small copy. The weights are stored once.

Where: the MLflow server only registers `mlflow-artifacts:` sources inside a run's or logged
model's artifact folder, so when the server's `--artifacts-destination` is known the
checkpoint is uploaded (with sparring.storage, manifest last) straight into its logged model's
folder in that storage; the version's source is `models:/<model_id>` and clients need only
`MLFLOW_TRACKING_URI`. Otherwise (e.g. a sqlite store) it goes to the pipeline's checkpoint URI,
which is then the version's source. Either way the version's `sparring.checkpoint` tag is the
verified storage URI.

`publish`, safe to retry:
  1. a version for this run's iteration exists (a retried task): return it, create nothing;
  2. find or create the iteration's logged model (PENDING), upload into it (write-once,
     resumable) and `storage.verify` it: a failure leaves it PENDING and registers nothing;
  3. log the eval metrics against it (`model_id`), then finalize it READY;
  4. create the version from a READY logged model only, tagged and described (model card);
  5. move `champion` if the version beats the champion (`improves`: its paired gain over the
     champion on the same val games exceeds that gain's standard error): compare-and-set
     against the version the decision was made on (`move_champion`).

Each version keeps its per-game val scores (the run artifact `champion/val_scores.json`) and
its recipe's `eval_key` (a tag): a champion scored on other val games or another evaluation
can't be paired, so `publish` refuses to compare with it.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

from mlflow.entities import Metric
from mlflow.entities.logged_model_status import LoggedModelStatus
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from sparring import storage
from sparring.image_stacks import MODEL_PACKAGES, STACKS
from sparring.stats import paired_gain
from sparring.tracking import CHAMPION, CHECKPOINT_TAG, MEMBER_TAG, RUN_TAG, connect

MODEL_ID_TAG = "sparring.model_id"  # the version's logged model (search results omit model_id)
EVAL_KEY_TAG = "sparring.eval_key"  # what its score is comparable with (Recipe.eval_key)
SCORES_ARTIFACT = "champion/val_scores.json"  # its per-val-game scores, in its run
INFERENCE_TASK = "llm/v1/chat"  # pyfunc takes {"messages": [...]} and returns chat.completion
_TOKENIZER_DIR = "components/tokenizer"  # where MLflow's transformers flavour reads it
# The image that trained the checkpoint (`<repository>:<version>-<flavour>`): the KFP pipeline
# sets it on the register task, which runs on the CPU image while training ran on the GPU one.
TRAINER_IMAGE_ENV = "SPARRING_TRAINER_IMAGE"
# What the model's `input_example.json` holds: a chat request as the pyfunc (llm/v1/chat) and a
# serving endpoint (`/invocations`) take it.
INPUT_EXAMPLE = {
    "messages": [
        {
            "role": "system",
            "content": "You are player A. Reply with [message], [propose], [accept] or [reject].",
        },  # fmt: skip
        {"role": "user", "content": "Player B: [message] I value Ava most for paper 2."},
    ],
    "max_tokens": 64,
}


class NotRegisteredError(RuntimeError):
    """Registration refused: the logged model is not READY (half-written) or failed."""


class Registration(NamedTuple):
    """What `register_checkpoint` did (or found, on a retry)."""

    version: str  # the model version of this checkpoint
    model_id: str  # its MLflow 3 logged model
    checkpoint_uri: str  # where the checkpoint (an MLflow model) is stored, verified
    is_champion: bool  # whether `champion` points at it afterwards
    champion_version: str  # where `champion` points afterwards
    champion_score: float  # the champion's score afterwards


# -- packaging ---------------------------------------------------------------------------------


def trainer_requirements(image: str | None = None) -> dict[str, str]:
    """{package: version} of MODEL_PACKAGES in the environment that trained the model: the
    Sparring image `image` (default: $SPARRING_TRAINER_IMAGE) names, as its lock pins them
    (`sparring.image_stacks`: `<version>-gpu` and its flavours `<version>-gpu-<flavour>` have
    the gpu stack); without one, or for an image Sparring did not build, this process's own
    (a local run trains where it registers)."""
    image = image if image is not None else os.environ.get(TRAINER_IMAGE_ENV, "")
    tag = image.rpartition(":")[2] if "/" not in image.rpartition(":")[2] else ""
    for base in STACKS:
        if f"-{base}-" in f"{tag}-":
            return dict(STACKS[base])
    return {p: importlib.metadata.version(p).split("+")[0] for p in MODEL_PACKAGES}


def stage_mlflow_model(
    checkpoint: str | Path,
    out_dir: str | Path,
    requirements: Mapping[str, str] | None = None,
    files: list[tuple[str, int]] | None = None,
) -> Path:
    """`out_dir` = the HF checkpoint as an MLflow transformers model, ready to upload: links to
    every checkpoint file (no weight is copied), the tokenizer again under
    `components/tokenizer`, `MLmodel`, a chat `input_example.json` (INPUT_EXAMPLE), and
    `requirements.txt` + `python_env.yaml` pinning `requirements` (default:
    `trainer_requirements()`, the stack that trained it). With `files` (the stored
    checkpoint's (path, size), `checkpoint` then holding only its config and tokenizer files)
    only MLflow's files are staged, to be added beside the stored weights."""
    import transformers
    from mlflow.models import Model
    from mlflow.models.utils import _save_example
    from mlflow.pyfunc import add_to_model
    from mlflow.transformers.llm_inference_utils import _SIGNATURE_FOR_LLM_INFERENCE_TASK
    from mlflow.utils.environment import _PythonEnv

    src, out = Path(checkpoint).resolve(), Path(out_dir)
    pins = dict(requirements or trainer_requirements())
    for path in sorted(p for p in src.rglob("*") if p.is_file() and files is None):
        link = out / path.relative_to(src)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(path)
    tokenizer = transformers.AutoTokenizer.from_pretrained(src)
    if not tokenizer.chat_template:
        raise ValueError(f"{src} has no chat template: MLflow's chat task needs one")
    tokenizer.save_pretrained(out / _TOKENIZER_DIR)
    config = json.loads((src / "config.json").read_text())
    dtype = config.get("dtype") or config.get("torch_dtype") or "float32"
    if files is None:
        files = [(str(p.relative_to(src)), p.stat().st_size) for p in src.rglob("*") if p.is_file()]
    model = Model(  # the same checkpoint stages the same bytes: a retried upload is a no-op
        metadata={"task": INFERENCE_TASK},
        signature=_SIGNATURE_FOR_LLM_INFERENCE_TASK[INFERENCE_TASK],
        model_uuid=hashlib.sha256(repr(sorted(files)).encode()).hexdigest()[:32],
        utc_time_created=time.strftime(
            "%Y-%m-%d %H:%M:%S", time.gmtime((src / "config.json").stat().st_mtime)
        ),
    )
    model.add_flavor(
        "transformers",
        task="text-generation",
        inference_task=INFERENCE_TASK,
        instance_type="TextGenerationPipeline",
        pipeline_model_type=config["architectures"][0],
        source_model_name=config.get("_name_or_path") or src.name,
        model_binary=".",  # the weights are the checkpoint's own files, not a copy
        components=["tokenizer"],
        tokenizer_type=type(tokenizer).__name__,
        torch_dtype=f"torch.{dtype}",
        framework="pt",
        transformers_version=pins["transformers"],  # the trainer's, as requirements.txt
    )
    add_to_model(model, loader_module="mlflow.transformers", python_env="python_env.yaml")
    (out / "requirements.txt").write_text("".join(f"{p}=={v}\n" for p, v in sorted(pins.items())))
    _save_example(model, INPUT_EXAMPLE, str(out))
    python = ".".join(map(str, sys.version_info[:3]))
    _PythonEnv(python, ["pip"], ["-r requirements.txt"]).to_yaml(out / "python_env.yaml")
    model.save(out / "MLmodel")
    return out


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")  # files `add_mlflow_files` skips


def add_mlflow_files(uri: str, storage_config: storage.StorageConfig | None = None) -> None:
    """Make the stored HF checkpoint at `uri` an MLflow model too (`stage_mlflow_model`'s files
    added beside its weights, which are not downloaded); a no-op once it has an MLmodel."""
    entries = storage.verify(uri, storage_config)
    if any(e.path == "MLmodel" for e in entries):
        return  # a retried register staged it already
    small = [e for e in entries if not e.path.endswith(WEIGHT_SUFFIXES)]
    with tempfile.TemporaryDirectory(prefix="sparring-mlmodel-") as tmp:
        src, out = Path(tmp) / "src", Path(tmp) / "out"
        storage.download_dir(uri, src, storage_config, small)
        stage_mlflow_model(src, out, files=[(e.path, e.size) for e in entries])
        storage.add_files(out, uri, storage_config)


# -- registration ------------------------------------------------------------------------------


def model_card(
    name: str, version: str, facts: Mapping[str, str], metrics: Mapping[str, float]
) -> str:
    """The version's description (Markdown): what it is, its eval table, how to load it."""
    rows = "\n".join(f"| {k} | {facts[k]} |" for k in facts)
    evals = "\n".join(f"| {k} | {v:.4f} |" for k, v in sorted(metrics.items()))
    uri = f"models:/{name}/{version}"
    return (
        f"# {name} v{version}\n\n| | |\n|---|---|\n{rows}\n\n"
        f"## Evaluation\n\n| metric | value |\n|---|---|\n{evals}\n\n"
        "## Load it (only `MLFLOW_TRACKING_URI` needed)\n\n"
        f'```python\nimport mlflow\nchat = mlflow.transformers.load_model("{uri}")\n'
        f'chat([{{"role": "user", "content": "..."}}], max_new_tokens=256)\n'
        f'model = mlflow.pyfunc.load_model("{uri}")\n'
        f'model.predict({{"messages": [{{"role": "user", "content": "..."}}]}})\n'
        f'path = mlflow.artifacts.download_artifacts("{uri}")  # a plain HF folder\n```\n'
    )


def _find_version(
    client: MlflowClient, name: str, run_id: str, iteration: int, member: str | None = None
):
    """The version a previous try registered for this run's iteration (and population
    member), if any."""
    for v in client.search_model_versions(f"name = '{name}' and run_id = '{run_id}'"):
        if v.tags.get("iteration") == str(iteration) and v.tags.get(MEMBER_TAG) == member:
            return v
    return None


def _logged_model(client: MlflowClient, run_id: str, iteration: int, member: str | None = None):
    """The run's logged model for `iteration` (and population member): found (a retry;
    PENDING if it died) or new."""
    run = client.get_run(run_id)
    tags = {"iteration": str(iteration)} | ({MEMBER_TAG: member} if member else {})
    for model in client.search_logged_models([run.info.experiment_id]):
        ours = model.source_run_id == run_id and model.tags.get("iteration") == str(iteration)
        if ours and model.tags.get(MEMBER_TAG) == member:
            return model
    return client.create_logged_model(
        run.info.experiment_id,
        name=f"iteration-{iteration}" + (f"-{member}" if member else ""),
        source_run_id=run_id,
        tags=tags,
        model_type="transformers",
    )


def storage_uri(artifact_location: str, artifacts_destination: str | None) -> str | None:
    """Where `mlflow-artifacts:/<path>` is stored (`<destination>/<path>`), or None when the
    server's destination is not known."""
    if not artifacts_destination or not artifact_location.startswith("mlflow-artifacts:"):
        return None
    path = artifact_location.removeprefix("mlflow-artifacts:").lstrip("/")
    return f"{artifacts_destination.rstrip('/')}/{path}"


def ready_model_id(client: MlflowClient, model_id: str) -> str:
    """`model_id` if its logged model is READY, else NotRegisteredError: a PENDING model is
    half-written (its task died before its upload was verified)."""
    status = client.get_logged_model(model_id).status
    if status != LoggedModelStatus.READY:
        raise NotRegisteredError(
            f"logged model {model_id} is {status}, not READY: only a verified checkpoint is "
            "registered; rerun the register step to finish and verify its upload"
        )
    return model_id


def move_champion(client: MlflowClient, name: str, version: str, expected: str | None) -> bool:
    """Point `champion` at `version` if it still points at `expected` (None = no champion),
    the version the decision was made against; False (nothing moved) if it has moved since."""
    current = champion(name, client)
    if (None if current is None else str(current.version)) != expected:
        return False
    client.set_registered_model_alias(name, CHAMPION, version)
    return True


def improves(
    score: float,
    scores: Mapping[str, float] | None,
    champion_score: float,
    champion_scores: Mapping[str, float] | None,
) -> bool:
    """Whether a version scoring `score` (`scores` per val game) replaces the champion: with
    per-game scores on both sides, when its paired gain on the shared games exceeds the gain's
    standard error (never on a single shared game, whose s.e. is unknown); else (a champion
    registered before per-game scores were kept) when its score is higher."""
    if scores and champion_scores:
        gain, se = paired_gain(champion_scores, scores)
        return gain > se
    return float(score) > float(champion_score)


def _champion_scores(client: MlflowClient, version) -> dict[str, float] | None:
    """The per-game val scores `version` was registered with, if it kept them."""
    try:
        with tempfile.TemporaryDirectory() as tmp:
            path = client.download_artifacts(version.run_id, SCORES_ARTIFACT, tmp)
            return json.loads(Path(path).read_text())
    except (MlflowException, OSError):
        return None


def _check_comparable(current, eval_key: str, model_name: str) -> None:
    """ValueError if the champion was scored by another evaluation than `eval_key`'s."""
    theirs = current.tags.get(EVAL_KEY_TAG) if current is not None else None
    if eval_key and theirs and theirs != eval_key:
        raise ValueError(
            f"{model_name}'s champion v{current.version} was scored by another evaluation "
            f"(eval key {theirs}, this run's {eval_key}: other val states, eval settings or "
            "champion metric), so the two can't be compared: set registered_model to a new "
            "name, or leave it unset (the default name carries the eval key)"
        )


def publish(
    client: MlflowClient,
    model_name: str,
    checkpoint: str | Path | None,
    *,
    run_id: str,
    iteration: int,
    metrics: Mapping[str, float],
    score: float,
    fallback_uri: str,
    scores: Mapping[str, float] | None = None,
    eval_key: str = "",
    artifacts_destination: str | None = None,
    tags: Mapping[str, str] | None = None,
    facts: Mapping[str, str] | None = None,
    parent_run_id: str | None = None,
    storage_config: storage.StorageConfig | None = None,
    stored: str | None = None,
    member: str | None = None,
) -> Registration:
    """Store the local `checkpoint` once as an MLflow model and register it (steps 1-5 of the
    module docstring).

    It goes into its logged model's own folder when the server's `artifacts_destination` is
    known (the version's source is then `models:/<model_id>`, served by the proxy), else to
    `fallback_uri` (source = that URI). `run_id` is the iteration's run; `metrics` (eval) are
    logged to it against the logged model at step `iteration` (and to `parent_run_id` for the
    curve across iterations); `tags` and `facts` (the model card's table) describe the version.
    `score` is its champion metric on val, `scores` the same per val game (game id -> score)
    and `eval_key` what they are comparable with (`Recipe.eval_key`); see `improves`.
    With `stored` (the checkpoint's verified storage URI; `checkpoint` then unused) nothing is
    uploaded: at `fallback_uri` MLflow's files are added beside the stored weights, elsewhere
    the checkpoint is first copied inside the store (S3: server-side).
    A population's `member` (sparring.population) is one version per iteration each, tagged
    `sparring.member` and under its own alias, the member's name (`member-0`, ...), which moves
    to each new version of that member.
    """
    # 1. a retry finds the version it made
    if (found := _find_version(client, model_name, run_id, iteration, member)) is not None:
        uri = found.tags[CHECKPOINT_TAG]
        model_id = found.tags[MODEL_ID_TAG]
        return _champion_state(client, model_name, str(found.version), model_id, uri)
    _check_comparable(champion(model_name, client), eval_key, model_name)
    try:
        client.create_registered_model(model_name)
    except MlflowException as e:
        if e.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
    # 2. upload into the (PENDING) logged model; nothing is registered unless storage verifies it
    model = _logged_model(client, run_id, iteration, member)
    uri = storage_uri(model.artifact_location, artifacts_destination) or fallback_uri
    if stored is None:
        with tempfile.TemporaryDirectory(prefix="sparring-mlmodel-") as tmp:
            storage.upload_dir(stage_mlflow_model(checkpoint, tmp), uri, storage_config, True)
    else:  # already stored: copied inside the store if it is not where the registry wants it
        if stored.rstrip("/") != uri.rstrip("/"):
            storage.copy_dir(stored, uri, storage_config)
        add_mlflow_files(uri, storage_config)
    storage.verify(uri, storage_config)
    # 3. metrics against the logged model, which is READY only now
    now = int(time.time() * 1000)
    batch = [Metric(k, float(v), now, iteration, model.model_id) for k, v in metrics.items()]
    client.log_batch(run_id, metrics=batch)
    if parent_run_id:
        batch = [Metric(k, float(v), now, iteration) for k, v in metrics.items()]
        client.log_batch(parent_run_id, metrics=batch)
    if scores:
        client.log_dict(run_id, dict(scores), SCORES_ARTIFACT)
    client.set_logged_model_tags(model.model_id, {CHECKPOINT_TAG: uri})
    client.finalize_logged_model(model.model_id, LoggedModelStatus.READY)
    # 4. the version, from a READY logged model only
    version_tags = {CHECKPOINT_TAG: uri, MODEL_ID_TAG: model.model_id, "iteration": str(iteration)}
    version_tags["score"] = repr(float(score))
    if eval_key:
        version_tags[EVAL_KEY_TAG] = eval_key
    if member:
        version_tags[MEMBER_TAG] = member
    version = str(
        client.create_model_version(
            model_name,
            source=f"models:/{model.model_id}" if uri != fallback_uri else uri,
            run_id=run_id,
            tags=version_tags | dict(tags or {}),
            model_id=ready_model_id(client, model.model_id),
        ).version
    )
    card = model_card(model_name, version, {"iteration": str(iteration), **(facts or {})}, metrics)
    client.update_model_version(model_name, version, description=card)
    if member:
        client.set_registered_model_alias(model_name, member, version)
    # 5. champion: compare-and-set against the champion the decision was made on
    for _ in range(3):
        current = champion(model_name, client)
        better = current is None or improves(
            score, scores, float(current.tags["score"]), _champion_scores(client, current)
        )
        if not better or move_champion(
            client, model_name, version, current and str(current.version)
        ):
            break
    return _champion_state(client, model_name, version, model.model_id, uri)


def _champion_state(
    client: MlflowClient, name: str, version: str, model_id: str, uri: str
) -> Registration:
    current = champion(name, client)
    assert current is not None, f"{name} has versions but no champion"
    return Registration(
        version,
        model_id,
        uri,
        str(current.version) == version,
        str(current.version),
        float(current.tags["score"]),
    )


def champion(model_name: str, client: MlflowClient | None = None):  # -> ModelVersion | None
    """The model version under the `champion` alias, or None if there is none yet."""
    client = client or connect()
    try:
        return client.get_model_version_by_alias(model_name, CHAMPION)
    except MlflowException as e:
        if e.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
            return None
        raise


def resolve_model_uri(uri: str, client: MlflowClient | None = None) -> str:
    """`models:/name@alias` or `models:/name/<version>` -> that version's stored checkpoint
    (its `sparring.checkpoint` tag, else its source), for pipeline steps that read storage
    directly. Anything else (an S3 URI, a path, a hub name) comes back unchanged.
    """
    if not uri.startswith("models:/"):
        return uri
    ref = uri.removeprefix("models:/")
    client = client or connect()
    if "@" in ref:
        name, alias = ref.split("@", 1)
        found = client.get_model_version_by_alias(name, alias)
    else:
        name, _, version = ref.rpartition("/")
        if not name or not version.isdigit():
            raise ValueError(
                f"Bad model URI {uri!r}: use models:/<name>@<alias> or models:/<name>/<n>."
            )
        found = client.get_model_version(name, version)
    return found.tags.get(CHECKPOINT_TAG) or found.source


def stored_checkpoint(
    model_name: str,
    run_name: str,
    iteration: int,
    client: MlflowClient | None = None,
    member: str | None = None,
) -> str:
    """The verified storage URI of the checkpoint that iteration `iteration` of pipeline run
    `run_name` registered (its version's `sparring.checkpoint` tag), wherever `register` stored
    it: its logged model's folder behind the artifact proxy, or `<root>/<run>/<i>/checkpoint`
    (a population `member`'s: its own version of that iteration). The newest such version if
    a run name was reused; LookupError if there is none yet."""
    client = client or connect()
    whose = f" and tags.`{MEMBER_TAG}` = '{member}'" if member else ""
    found = client.search_model_versions(
        f"name = '{model_name}' and tags.`{RUN_TAG}` = '{run_name}' "
        f"and tags.iteration = '{iteration}'{whose}",
        order_by=["version_number DESC"],
        max_results=1,
    )
    if not found:
        raise LookupError(
            f"{model_name} has no version for run {run_name!r} iteration {iteration}"
            f"{f' member {member}' if member else ''}: its register step has not finished "
            "(a rollout seating past-<k>, or a population's next rollout, must run after it)"
        )
    return found[0].tags[CHECKPOINT_TAG]
