"""The one config file of a self-play run (`sparring run|compile|submit`): a recipe and its
deployment.

    sparring run                                  # the embedded default, configs/pipeline.yaml
    sparring run --config configs/pipeline.yaml --iterations 3
    sparring compile --config configs/pipeline-gpu.yaml -o pipeline.yaml

`sparring.recipe.Recipe` is what is trained (game, model, warm start, rollout, GRPO, eval,
opponents, schedule); `Deployment` is where it runs (storage, tracking, Kubernetes). Storage layout:
`<storage.root>/<run>/<iteration>/{rollout,checkpoint,eval}` and `<storage.root>/<run>/inits`,
plus `<storage.root>/<run>/initial` (iteration 0's model) when the opponent pool names `past-<k>`.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from sparring import __version__
from sparring.configs import CONFIG_DIR
from sparring.gpu_memory import fit_warnings
from sparring.recipe import Recipe
from sparring.settings import TrackingConfig
from sparring.storage import StorageConfig

# The runtime images, as images/build.sh tags them: <repository>:<version>-cpu|-gpu.
IMAGE_REPOSITORY = "ghcr.io/sparring/sparring"
IMAGE = f"{IMAGE_REPOSITORY}:{__version__}-cpu"
GPU_IMAGE = f"{IMAGE_REPOSITORY}:{__version__}-gpu"

DEFAULT_CONFIG = CONFIG_DIR / "pipeline.yaml"


class GPUMemoryWarning(UserWarning):
    """A GPU task's estimated memory (sparring.gpu_memory) exceeds its card."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


class StorageSettings(_Strict):
    """Where checkpoints and datasets go. Credentials come from the AWS env (a K8s Secret)."""

    root: str = "s3://sparring/runs"  # s3://bucket/prefix, or file:///abs/path / a local path
    endpoint_url: str | None = None  # S3 endpoint; None = $AWS_ENDPOINT_URL_S3 / AWS itself
    region: str = "us-east-1"

    def client_config(self) -> StorageConfig:
        """The storage layer's config: env credentials plus the endpoint set here."""
        overrides = {"endpoint_url": self.endpoint_url} if self.endpoint_url else {}
        return StorageConfig.from_env(region=self.region, **overrides)


class Toleration(_Strict):
    """A Kubernetes toleration (see `kubectl explain pod.spec.tolerations`)."""

    key: str | None = None
    operator: Literal["Equal", "Exists"] = "Equal"
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None


class Resources(_Strict):
    """One step's container: requests, limits (Kubernetes quantities) and timeout. A field left
    None takes the step's default (`STEP_RESOURCES`)."""

    cpu: str | None = None  # CPU request, e.g. "4"
    cpu_limit: str | None = None
    memory: str | None = None  # memory request, e.g. "32Gi"
    memory_limit: str | None = None
    # Ephemeral storage: KFP's IR (2.17) has no ephemeral-storage request, so the step's scratch
    # is a disk-backed emptyDir at /tmp whose sizeLimit the kubelet enforces (evicts beyond it).
    scratch: str | None = None
    timeout_seconds: int | None = Field(None, ge=1)  # the pod's activeDeadlineSeconds


_LIGHT = Resources(
    cpu="1", cpu_limit="2", memory="2Gi", memory_limit="4Gi", scratch="20Gi", timeout_seconds=3600
)
_HEAVY = Resources(
    cpu="4",
    cpu_limit="8",
    memory="32Gi",
    memory_limit="64Gi",
    scratch="200Gi",
    timeout_seconds=43200,
)
# Default resources per step (its component's name, e.g. `rollout` for every rollout-<i>).
STEP_RESOURCES = {
    **dict.fromkeys(
        ("start", "game-init", "initial-model", "register", "finish", "merge-rollouts"), _LIGHT
    ),
    **dict.fromkeys(
        (
            "warm-start",
            "rollout",
            "rollout-shard",
            "train",
            "train-verl",
            "evaluate",
            "evaluate-test",
        ),
        _HEAVY,
    ),
}
# Task retries: the first after 30 s, each next one twice as late; every attempt may take
# 10 min beyond its timeout to be scheduled and pull its image (Argo's clock starts at creation).
RETRY_BACKOFF_SECONDS, RETRY_BACKOFF_FACTOR, RETRY_SLACK_SECONDS = 30, 2, 600
# Steps without side effects: the only ones `kubernetes.caching` may cache.
PURE_STEPS = ("game-init", "initial-model", "warm-start")


class KubernetesSettings(_Strict):
    """How the tasks run on the cluster; all of it is ignored by `sparring run` (kfp.local)."""

    image: str = IMAGE  # image of every task (CPU)
    gpu_image: str = GPU_IMAGE  # image of tasks that request an accelerator
    accelerator_type: str = "nvidia.com/gpu"  # resource name of the accelerator
    rollout_gpus: int = Field(0, ge=0)  # accelerators per rollout task (0 = CPU)
    train_gpus: int = Field(0, ge=0)  # accelerators per train (and warm-start) task
    eval_gpus: int = Field(0, ge=0)  # accelerators per evaluate task
    node_selector: dict[str, str] = Field(default_factory=dict)  # for accelerator tasks
    tolerations: list[Toleration] = Field(default_factory=list)  # for accelerator tasks
    s3_secret: str | None = "sparring-s3"  # Secret with AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY
    shm_size: str | None = "8Gi"  # /dev/shm emptyDir (medium Memory) on GPU tasks; None = off
    hf_secret: str | None = None  # Secret with HF_TOKEN (gated hub models), as env on every task
    # Secret with MLFLOW_TRACKING_USERNAME/PASSWORD (an MLflow server behind basic auth), as env
    # on every task; None = MLflow needs no login
    mlflow_secret: str | None = None
    model_cache_pvc: str | None = None  # PVC mounted at every task's HF cache ($HF_HOME)
    # Retries per task (S3/MLflow hiccups, preemption), 30 s apart, doubling; Argo stops retrying
    # at `retry_max_duration(step)` after the first attempt began. Which failures Argo retries is
    # its cluster's policy, not the pipeline's (docs/cluster.md, "Retries").
    retries: int = Field(0, ge=0)
    # KFP step caching of the pure steps (game-init, initial-model, warm-start). Steps with side
    # effects (start, rollout, train, evaluate, register, finish) never cache.
    caching: bool = False
    resources: dict[str, Resources] = Field(default_factory=dict)  # per step: over STEP_RESOURCES
    # Every task's uid (the images' `sparring` user); None leaves it to the cluster, as
    # OpenShift's restricted-v2 SCC needs (it assigns a uid from the namespace's range and
    # rejects any other). Either way the pod must run as non-root.
    run_as_user: int | None = Field(10001, ge=1)
    # The images' gid (OpenShift-style group-writable home); None leaves it to the cluster.
    run_as_group: int | None = Field(0, ge=0)
    image_pull_secrets: list[str] = Field(default_factory=list)  # Secrets for every task's image
    # The run's deadline (with kfp_version 2.17 the Workflow's activeDeadlineSeconds; on 2.16 the
    # cluster's Argo workflowDefaults set it, docs/cluster.md); an MLflow parent run still RUNNING
    # after this long is stale (its KFP run ended before its exit handler): `start` closes it.
    run_deadline_seconds: int = Field(7 * 86400, ge=60)
    # The KFP backend the pipeline is compiled for. "2.16" (the Kubeflow manifests' KFP; runs on
    # 2.17 too) leaves out what its API server cannot parse: 2.17's run deadline
    # (pipelineConfig.activeDeadlineSeconds), which would make it drop the whole Kubernetes config.
    # "2.17" sets `run_deadline_seconds` as the Argo Workflow's activeDeadlineSeconds.
    kfp_version: Literal["2.16", "2.17"] = "2.16"
    kfp_ui_url: str | None = None  # KFP UI base URL, for the run link on the MLflow parent run

    @model_validator(mode="after")
    def _check_steps(self) -> KubernetesSettings:
        unknown = sorted(set(self.resources) - set(STEP_RESOURCES))
        if unknown:
            raise ValueError(
                f"kubernetes.resources names unknown steps {unknown}; steps: {sorted(STEP_RESOURCES)}"
            )
        return self

    def step_resources(self, step: str) -> Resources:
        """`step`'s resources: its overrides in `resources` over STEP_RESOURCES[step]."""
        override = self.resources.get(step, Resources()).model_dump(exclude_none=True)
        return STEP_RESOURCES[step].model_copy(update=override)

    def retry_max_duration(self, step: str) -> int:
        """Argo's `backoff.maxDuration` for `step` in seconds: it counts from the first
        attempt's start, so it covers every attempt running to the step's timeout, each with
        RETRY_SLACK_SECONDS to be scheduled, plus the backoffs between them."""
        backoffs = sum(RETRY_BACKOFF_SECONDS * RETRY_BACKOFF_FACTOR**i for i in range(self.retries))
        attempt = self.step_resources(step).timeout_seconds + RETRY_SLACK_SECONDS
        return (self.retries + 1) * attempt + backoffs

    def step_gpus(self, step: str) -> int:
        """Accelerators a step's pod requests (train-verl's count is `verl.n_gpus_per_node`)."""
        gpus = {"rollout": self.rollout_gpus, "rollout-shard": self.rollout_gpus}
        gpus |= {"train": self.train_gpus, "warm-start": self.train_gpus}
        return gpus.get(step, self.eval_gpus if step == "evaluate" else 0)


class Deployment(_Strict):
    """Where and how a recipe runs: the KFP pipeline's name, storage, tracking and Kubernetes.
    Only the KFP layer (pipelines/, components/) reads `kubernetes`; the loop gets storage and
    tracking as its ports."""

    name: str = "sparring-selfplay"
    """The KFP pipeline's name."""
    run_name: str | None = None
    """Display name of the MLflow parent run; None = the KFP run's name. Never a storage key."""
    campaign: str | None = None
    """Storage key shared by a campaign's runs (`<root>/<campaign>/<iteration>/…`), which
    `past-<k>` and the difficulty schedule look up; `sparring submit --campaign` sets a fresh
    `<name>-<uuid>`. None = the run's own unique id (the KFP run id)."""
    storage: StorageSettings = Field(default_factory=StorageSettings)
    """Where checkpoints and datasets go (S3 or a local folder)."""
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)
    """MLflow: tracking URI and experiment, or `enabled: false` for none."""
    kubernetes: KubernetesSettings = Field(default_factory=KubernetesSettings)
    """How the tasks run on a cluster: images, GPUs, Secrets, resources, retries."""


class PipelineConfig(Deployment, Recipe):
    """One YAML file (configs/pipeline.yaml): a recipe (`sparring.recipe.Recipe`) and its
    deployment, side by side at the top level."""

    @model_validator(mode="after")
    def _check_accelerators(self) -> PipelineConfig:
        k8s = self.kubernetes
        gpu_steps = k8s.rollout_gpus or k8s.train_gpus or k8s.eval_gpus
        if self.device == "cuda" and not gpu_steps and self.train_backend != "verl":
            raise ValueError(
                "device: cuda, but no step requests an accelerator (kubernetes.rollout_gpus, "
                "train_gpus and eval_gpus are 0), so every task would run on the CPU image: set "
                "device: auto (or cpu), or request GPUs for the steps that need them"
            )
        for line in fit_warnings(self):
            warnings.warn(line, GPUMemoryWarning, stacklevel=2)
        return self

    @model_validator(mode="after")
    def _game_images(self) -> PipelineConfig:
        """A game with an `image_flavour` runs on its `-<flavour>` images, unless the config
        names images itself."""
        k8s, flavour = self.kubernetes, self.game.cls.image_flavour
        if flavour:
            default = {"image": IMAGE, "gpu_image": GPU_IMAGE}
            update = {
                f: f"{default[f]}-{flavour}" for f in default if f not in k8s.model_fields_set
            }
            self.kubernetes = k8s.model_copy(update=update)
        return self

    @property
    def recipe(self) -> Recipe:
        """The recipe part alone."""
        return Recipe.model_validate(self.model_dump(include=set(Recipe.model_fields)))

    @property
    def deployment(self) -> Deployment:
        """The deployment part alone."""
        return Deployment.model_validate(self.model_dump(include=set(Deployment.model_fields)))

    def for_step(self, step: str) -> PipelineConfig:
        """The config as `step`'s task uses it (step names as in STEP_RESOURCES): with
        `device: cuda`, a step whose pod requests no accelerator runs on the CPU image, so its
        device is cpu."""
        if self.device != "cuda" or step == "train-verl" or self.kubernetes.step_gpus(step):
            return self
        return self.model_copy(update={"device": "cpu"})

    @classmethod
    def from_yaml(cls, path: str | Path | None = None) -> PipelineConfig:
        """The config in `path`; the embedded default (configs/pipeline.yaml) if None."""
        return cls.model_validate(yaml.safe_load(Path(path or DEFAULT_CONFIG).read_text()) or {})


def field_lines(model: type[BaseModel]) -> list[str]:
    """`name: description` for each top-level field of `model`, from its JSON schema."""
    props = model.model_json_schema()["properties"]
    return [f"{name}: {' '.join(p.get('description', '').split())}" for name, p in props.items()]
