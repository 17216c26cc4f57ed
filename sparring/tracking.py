"""MLflow tracking: one experiment per pipeline, a parent run with one child run per
iteration, live train curves, dataset lineage. Registering a checkpoint and the registry's
lookups (`champion`, `resolve_model_uri`) are `sparring.registry`.

    with PipelineRun.start(TrackingConfig(experiment="matching"), "run-1", params=cfg) as run:
        run.log_metrics(0, {"eval/selfplay/player_a/normalized_reward": 0.41})
        train(..., on_step=run.step_logger(0))     # train/* per optimizer step, while it runs
        run.log_dataset(0, "s3://sparring/runs/run-1/inits/train.parquet", "game-init-train")

`MLFLOW_TRACKING_URI` picks the server (default `sqlite:///mlflow.db`). A server
behind MLflow's basic-auth app takes `MLFLOW_TRACKING_USERNAME` / `MLFLOW_TRACKING_PASSWORD`
from the environment; they are never logged (params come from the config, which holds none).

KFP 2.17's MLflow plugin, when on, injects into every task `MLFLOW_RUN_ID` (a nested run per
task: never used as the parent), `MLFLOW_EXPERIMENT_ID` (unused: the config names the
experiment), `MLFLOW_TRACKING_URI` (used only when the config sets no `tracking_uri`) and
`MLFLOW_TRACKING_AUTH=kubernetes` (or `kubernetes-namespaced` with `MLFLOW_WORKSPACE`), under
which MLflow's client sends the service-account token instead of the basic-auth login. When
Sparring's own login is set (`MLFLOW_TRACKING_USERNAME`), `connect` removes those two, so the
login is what the server sees; without it the plugin's auth stays.
Browse with `mlflow ui --backend-store-uri sqlite:///mlflow.db`.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

import requests
from mlflow.entities import Dataset, DatasetInput, InputTag, Metric, Param
from mlflow.tracking import MlflowClient

from sparring.settings import TrackingConfig

CHAMPION = "champion"
ITERATION_TAG = "sparring.iteration"
MEMBER_TAG = "sparring.member"  # a population member's or the average's run and version
CHECKPOINT_TAG = "sparring.checkpoint"  # a version's verified storage URI (sparring.registry)
RUN_TAG = "run"  # a version's pipeline run (the storage key `<root>/<run>`)
_PARAM_MAX = 6000  # MLflow's limit on a param value
# What KFP 2.17's MLflow plugin sets MLFLOW_TRACKING_AUTH to (it then drops basic auth).
PLUGIN_AUTH = ("kubernetes", "kubernetes-namespaced")


class TrackingUnavailableError(RuntimeError):
    """The MLflow tracking server does not answer."""


def connect(config: TrackingConfig | None = None) -> MlflowClient:
    """A client for the tracking server and registry, after checking the server answers.

    An http(s) server must answer `/health` within `probe_timeout` (MLflow's own client would
    retry for minutes); a sqlite store gets its folder created.
    """
    config = config or TrackingConfig()
    uri = config.resolved_uri()
    _login_over_plugin_auth()
    if uri.startswith(("http://", "https://")):
        try:
            requests.get(
                f"{uri.rstrip('/')}/health", timeout=config.probe_timeout, auth=_basic_auth()
            ).raise_for_status()
        except requests.RequestException as e:
            raise TrackingUnavailableError(
                f"MLflow tracking server {uri} is unreachable ({type(e).__name__}). Start it "
                "(`mlflow server --backend-store-uri sqlite:///mlflow.db`) or fix "
                "MLFLOW_TRACKING_URI / TrackingConfig.tracking_uri."
            ) from e
    elif uri.startswith("sqlite:///"):
        Path(uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def _login_over_plugin_auth() -> None:
    """With Sparring's login set, drop the KFP MLflow plugin's Kubernetes auth from this
    process's environment (MLflow's client would send the token instead of the login)."""
    auth = os.environ.get("MLFLOW_TRACKING_AUTH")
    if os.environ.get("MLFLOW_TRACKING_USERNAME") and auth in PLUGIN_AUTH:
        print(
            f"MLflow: MLFLOW_TRACKING_AUTH={auth} (KFP's MLflow plugin) ignored: logging in as "
            "$MLFLOW_TRACKING_USERNAME (kubernetes.mlflow_secret)",
            file=sys.stderr,
        )
        for name in ("MLFLOW_TRACKING_AUTH", "MLFLOW_WORKSPACE"):
            os.environ.pop(name, None)


def _basic_auth() -> tuple[str, str] | None:
    """MLflow's own basic-auth variables, for requests this module makes itself."""
    user = os.environ.get("MLFLOW_TRACKING_USERNAME")
    return (user, os.environ.get("MLFLOW_TRACKING_PASSWORD", "")) if user else None


def numeric(metadata: Mapping[str, Any]) -> dict[str, float]:
    """The numeric entries of an artifact's metadata, as floats. On a KFP backend a consumed
    Metrics artifact's metadata also holds MLMD's string properties (`display_name`,
    `store_session_info`); booleans are dropped too."""
    return {
        k: float(v)
        for k, v in metadata.items()
        if isinstance(v, int | float) and not isinstance(v, bool)
    }


def flatten_params(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """`{"a": {"b": 1}}` -> `{"a.b": "1"}`; values cut to MLflow's 6000-character limit."""
    flat: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten_params(value, f"{name}."))
        else:
            flat[name] = str(value)[:_PARAM_MAX]
    return flat


class PipelineRun:
    """A pipeline's parent run, with one child run per iteration (found or created on demand).

    Build it with `start` (a new parent) or `attach` (a later task of the
    same pipeline). Metrics logged for an iteration go to its child run at step=iteration and
    to the parent at the same step, so the parent shows the curve across iterations. Attached
    for a `member` (a population's, or the average), the iteration's child run is the
    member's own, so that its metrics never overwrite the iteration's.
    """

    def __init__(
        self, client: MlflowClient, run_id: str, owned: bool, member: str | None = None
    ) -> None:
        self.client = client
        self.run_id = run_id
        self.experiment_id = client.get_run(run_id).info.experiment_id
        self.owned = owned  # we created it, so we end it
        self.member = member
        self._children: dict[int, str] = {}

    @classmethod
    def start(
        cls,
        config: TrackingConfig | None = None,
        run_name: str | None = None,
        params: Mapping[str, Any] | None = None,
        tags: Mapping[str, str] | None = None,
    ) -> PipelineRun:
        """Create the parent run (with `tags`) and log `params` once, flattened.

        `$MLFLOW_RUN_ID` is ignored: KFP 2.17's MLflow plugin injects a nested run per TASK
        there, not a parent for the pipeline (so `start`'s would end with its task).
        """
        config = config or TrackingConfig()
        client = connect(config)
        experiment = client.get_experiment_by_name(config.experiment)
        experiment_id = (
            experiment.experiment_id
            if experiment
            else client.create_experiment(config.experiment, config.artifact_location)
        )
        created = client.create_run(experiment_id, run_name=run_name, tags=dict(tags or {}))
        run = cls(client, created.info.run_id, True)
        if params:
            logged = client.get_run(run.run_id).data.params
            new = {k: v for k, v in flatten_params(params).items() if k not in logged}
            client.log_batch(run.run_id, params=[Param(k, v) for k, v in new.items()])
        return run

    @classmethod
    def attach(
        cls, run_id: str, config: TrackingConfig | None = None, member: str | None = None
    ) -> PipelineRun:
        """An existing parent run, e.g. from the task that started the pipeline."""
        return cls(connect(config), run_id, owned=False, member=member)

    def iteration_run(self, iteration: int) -> str:
        """The run id of iteration `iteration`'s child run (the `member`'s own), created on
        first use."""
        if iteration not in self._children:
            found = [
                r
                for r in self.client.search_runs(
                    [self.experiment_id],
                    filter_string=f"tags.mlflow.parentRunId = '{self.run_id}' "
                    f"and tags.`{ITERATION_TAG}` = '{iteration}'",
                )
                if r.data.tags.get(MEMBER_TAG) == self.member
            ]
            tags = {"mlflow.parentRunId": self.run_id, ITERATION_TAG: str(iteration)}
            self._children[iteration] = (
                found[0].info.run_id
                if found
                else self.client.create_run(
                    self.experiment_id,
                    run_name=f"iteration-{iteration}" + (f"-{self.member}" if self.member else ""),
                    tags=tags | ({MEMBER_TAG: self.member} if self.member else {}),
                ).info.run_id
            )
        return self._children[iteration]

    def log_metrics(self, iteration: int, metrics: Mapping[str, float]) -> None:
        """Log `metrics` (names like `eval/selfplay/player_a/normalized_reward`) for an iteration."""
        now = int(time.time() * 1000)
        batch = [Metric(k, v, now, iteration) for k, v in numeric(metrics).items()]
        for run_id in (self.iteration_run(iteration), self.run_id):
            self.client.log_batch(run_id, metrics=batch)

    def step_logger(self, iteration: int) -> Callable[[int, Mapping[str, float]], None]:
        """An `on_step(step, metrics)` for `sparring.train`: each optimizer step's metrics go to
        the iteration's run at that step, as training goes (a live curve in the MLflow UI)."""
        run_id = self.iteration_run(iteration)

        def on_step(step: int, metrics: Mapping[str, float]) -> None:
            now = int(time.time() * 1000)
            batch = [Metric(f"train_step/{k}", float(v), now, step) for k, v in metrics.items()]
            self.client.log_batch(run_id, metrics=batch)

        return on_step

    def log_dataset(
        self, iteration: int, uri: str, name: str, digest: str, context: str = "train"
    ) -> None:
        """Record the dataset at `uri` (digest: e.g. its sha256) as an input of the iteration's
        run (`mlflow.log_input`), without reading it: the run's lineage in the UI."""
        source = json.dumps({"uri": uri})
        dataset = Dataset(name, digest[:36], "s3" if uri.startswith("s3://") else "local", source)
        tags = [InputTag("mlflow.data.context", context)]
        self.client.log_inputs(self.iteration_run(iteration), [DatasetInput(dataset, tags)])

    def log_artifact(
        self, path: str | Path, iteration: int | None = None, dest: str | None = None
    ) -> None:
        """Upload a file or folder (plots, `games.jsonl`, samples) to the iteration's run
        (or the parent's when `iteration` is None), under the artifact folder `dest`."""
        run_id = self.run_id if iteration is None else self.iteration_run(iteration)
        path = Path(path)
        log = self.client.log_artifacts if path.is_dir() else self.client.log_artifact
        log(run_id, str(path), dest)

    def finish(self, status: str = "FINISHED") -> None:
        """End the child runs and, if we created it, the parent run."""
        for child in self._children.values():
            self.client.set_terminated(child, status)
        if self.owned:
            self.client.set_terminated(self.run_id, status)

    def __enter__(self) -> PipelineRun:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.finish("FAILED" if exc_type else "FINISHED")
