"""The one config of the iterative self-play pipeline (`sparring run|compile|submit`).

    sparring run                                  # the embedded default, configs/pipeline.yaml
    sparring run --config configs/pipeline.yaml --iterations 3
    sparring compile --config configs/pipeline-gpu.yaml -o pipeline.yaml

The game (`game: {name, params}`) is set once at the top and copied into the game-init,
rollout and eval sub-configs (which are the library's own configs); so is `device`, into the
GRPO and SFT sections. Setting either again inside a section is an error. Storage layout:
`<storage.root>/<run>/<iteration>/{rollout,checkpoint,eval}` and `<storage.root>/<run>/inits`,
plus `<storage.root>/<run>/initial` (iteration 0's model) when the opponent pool names `past-<k>`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from sparring import __version__
from sparring.configs import CONFIG_DIR
from sparring.evaluate import EvalConfig
from sparring.game_init import GameInitConfig
from sparring.games import GameSpec
from sparring.opponents import DifficultyConfig, past_steps
from sparring.rollout import RolloutConfig
from sparring.samples import check_group_key
from sparring.settings import TrackingConfig
from sparring.storage import StorageConfig
from sparring.verl_backend.config import VerlConfig

# The runtime images, as images/build.sh tags them: <repository>:<version>-cpu|-gpu.
IMAGE_REPOSITORY = "ghcr.io/sparring/sparring"
IMAGE = f"{IMAGE_REPOSITORY}:{__version__}-cpu"
GPU_IMAGE = f"{IMAGE_REPOSITORY}:{__version__}-gpu"

DEFAULT_CONFIG = CONFIG_DIR / "pipeline.yaml"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class WarmStart(_Strict):
    """Supervised warm start of the initial model on scripted self-play (before iteration 0)."""

    agent: str | None = None  # scripted agent that plays every seat; None = the game's default
    num_states: int = Field(32, ge=1)  # train initial states it plays (once each)
    train: dict[str, Any] = Field(default_factory=dict)  # SFT settings: sparring.sft.SFTConfig


class PipelineRollout(RolloutConfig):
    """The pipeline's `rollout:` section: the library's RolloutConfig plus the fan-out."""

    model_config = ConfigDict(extra="forbid")
    shards: int = Field(1, ge=1)
    """Parallel rollout tasks per iteration (each a pod with `kubernetes.rollout_gpus`), each
    playing a contiguous slice of the iteration's initial states; one task merges them into the
    rollout a single task would write (sparring.loop.shards). 1 = one rollout task."""


class Opponents(_Strict):
    """Who the learner plays in each rollout (seed 001; see sparring.opponents): pure self-play,
    or a share of the games with the learner in one role against opponents whose strength
    follows that role's difficulty schedule, carried from iteration to iteration. The pool
    holds scripted agents and earlier checkpoints of the run: `past-<k>` is the policy that
    played the rollout k iterations before (sparring.loop.league loads it from storage)."""

    selfplay_fraction: float = Field(1.0, ge=0.0, le=1.0)  # 1 = pure self-play (the default)
    difficulty: DifficultyConfig | None = None  # the pool (scripted agents, past-<k>); mix only

    @property
    def mixed(self) -> bool:
        """Whether some games seat the learner against the pool."""
        return self.selfplay_fraction < 1.0

    @property
    def checkpoint_steps(self) -> list[int]:
        """k of every `past-<k>` in the pool, ascending; [] without an opponent mix."""
        if not self.mixed:
            return []
        pool = self.difficulty.pool if self.difficulty else []
        return sorted(k for name in pool if (k := past_steps(name)))


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
        ("warm-start", "rollout", "rollout-shard", "train", "train-verl", "evaluate"), _HEAVY
    ),
}
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
    retries: int = Field(0, ge=0)  # retries per task (S3/MLflow hiccups, preemption)
    # KFP step caching of the pure steps (game-init, initial-model, warm-start). Steps with side
    # effects (start, rollout, train, evaluate, register, finish) never cache.
    caching: bool = False
    resources: dict[str, Resources] = Field(default_factory=dict)  # per step: over STEP_RESOURCES
    run_as_user: int = 10001  # every task's uid (the images' `sparring` user): non-root
    run_as_group: int = 0  # the images' gid (OpenShift-style group-writable home)
    image_pull_secrets: list[str] = Field(default_factory=list)  # Secrets for every task's image
    # The run's activeDeadlineSeconds; an MLflow parent run still RUNNING after this long is
    # stale (its KFP run was terminated before its exit handler) and the next `start` closes it.
    run_deadline_seconds: int = Field(7 * 86400, ge=60)
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

    def step_gpus(self, step: str) -> int:
        """Accelerators a step's pod requests (train-verl's count is `verl.n_gpus_per_node`)."""
        gpus = {"rollout": self.rollout_gpus, "rollout-shard": self.rollout_gpus}
        gpus |= {"train": self.train_gpus, "warm-start": self.train_gpus}
        return gpus.get(step, self.eval_gpus if step == "evaluate" else 0)


class PipelineConfig(_Strict):
    """Everything one self-play pipeline run needs (see configs/pipeline.yaml)."""

    name: str = "sparring-selfplay"  # KFP pipeline name
    run_name: str | None = None  # storage folder and MLflow parent run; None = the KFP job name
    game: GameSpec = Field(default_factory=GameSpec)  # {name, params}, copied into sub-configs
    model: str = "tiny"  # initial model: "tiny", a hub name, a path, s3://… or models:/name@alias
    warm_start: WarmStart | None = None  # SFT on scripted games before iteration 0; None = off
    iterations: int = Field(2, ge=1)  # rollout→train→evaluate→register rounds (unrolled)
    first_iteration: int = Field(0, ge=0)  # index of the first round (the campaign driver sets it)
    games_per_iteration: int = Field(64, ge=1)  # self-play games per rollout
    # Evaluate the starting model (after the warm start) before the first update, as iteration
    # first_iteration - 1, so a run's gain is measured from where GRPO began.
    evaluate_start: bool = False
    device: str = "auto"  # cpu, cuda or auto: every task's device (not set in `train:`)
    game_init: GameInitConfig = Field(default_factory=GameInitConfig)  # state counts and seed
    rollout: PipelineRollout = Field(default_factory=PipelineRollout)  # i samples with seed+i
    opponents: Opponents = Field(default_factory=Opponents)  # self-play or the opponent mix
    # GRPO settings: sparring.train.GRPOConfig fields, among them the group key (`group_key`:
    # game, init, role, batch, or one of the game's `extra_group_keys`).
    train: dict[str, Any] = Field(default_factory=dict)
    # Who trains each iteration. torch: the pipeline's rollout step, then `sparring.train` (CPU
    # or one GPU). verl: one `verl-train` task per iteration runs verl's main_ppo with online
    # self-play inside verl (route 1, sparring.verl_backend) on `verl.n_gpus_per_node` GPUs and
    # merges its FSDP checkpoint to HF; `rollout` and `train` are then unused.
    train_backend: Literal["torch", "verl"] = "torch"
    verl: VerlConfig = Field(default_factory=VerlConfig)  # train_backend: verl settings
    eval: EvalConfig = Field(default_factory=EvalConfig)  # modes, val games, sampling
    storage: StorageSettings = Field(default_factory=StorageSettings)
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)  # MLflow URI + experiment
    registered_model: str | None = None  # MLflow registered model; None = sparring-<game>
    champion_metric: str = "eval/selfplay/all/normalized_reward"  # higher wins `champion`
    kubernetes: KubernetesSettings = Field(default_factory=KubernetesSettings)

    @model_validator(mode="after")
    def _check(self) -> PipelineConfig:
        for name, sub in (
            ("game_init", self.game_init),
            ("rollout", self.rollout),
            ("eval.rollout", self.eval.rollout),
        ):
            if "game" in sub.model_fields_set and sub.game != self.game:
                raise ValueError(
                    f"{name}.game={sub.game!r} differs from the top-level game={self.game!r}: "
                    "set it once, at the top."
                )
            sub.game = self.game
        for name, section in (("train", self.train), ("warm_start.train", self.ws_train)):
            if "device" in section:
                raise ValueError(
                    f"{name}.device is set; set the top-level `device` (used by every task)"
                )
        if "group_key" in self.train:
            self.train["group_key"] = check_group_key(self.game, self.train["group_key"])
        if self.registered_model is None:
            self.registered_model = f"sparring-{self.game.name}"
        if self.warm_start is not None and self.warm_start.agent is None:
            self.warm_start.agent = self.game.cls.default_opponent
        if self.games_per_iteration % self.rollout.games_per_init:
            raise ValueError(
                f"games_per_iteration ({self.games_per_iteration}) must be a multiple of "
                f"rollout.games_per_init ({self.rollout.games_per_init})"
            )
        if self.game_init.num_train < 1 or self.game_init.num_val < 1:
            raise ValueError("game_init.num_train and game_init.num_val must both be >= 1")
        if "champion_metric" in self.model_fields_set and not self.champion_metric.startswith(
            "eval/"
        ):
            raise ValueError(f"champion_metric {self.champion_metric!r} must be an eval/* metric")
        k8s = self.kubernetes
        gpu_steps = k8s.rollout_gpus or k8s.train_gpus or k8s.eval_gpus
        if self.device == "cuda" and not gpu_steps and self.train_backend != "verl":
            raise ValueError(
                "device: cuda, but no step requests an accelerator (kubernetes.rollout_gpus, "
                "train_gpus and eval_gpus are 0), so every task would run on the CPU image: set "
                "device: auto (or cpu), or request GPUs for the steps that need them"
            )
        if self.train_backend == "verl":
            self._check_verl()
        if self.rollout.shards > 1:
            self._check_shards()
        if self.opponents.mixed:
            self._check_opponents()
        return self

    def _check_shards(self) -> None:
        """What the rollout fan-out (`rollout.shards` > 1) needs of the config."""
        shards, states = (
            self.rollout.shards,
            self.games_per_iteration // self.rollout.games_per_init,
        )
        if self.train_backend != "torch":
            raise ValueError(
                "rollout.shards > 1 needs train_backend: torch (verl plays inside verl; scale it "
                "with verl.nnodes)"
            )
        if self.opponents.mixed:
            raise ValueError(
                "rollout.shards > 1 needs pure self-play (opponents.selfplay_fraction: 1): the "
                "opponent mix carries one difficulty schedule from rollout to rollout"
            )
        if shards > states:
            raise ValueError(
                f"rollout.shards={shards} exceeds the {states} initial states of an iteration "
                f"(games_per_iteration / rollout.games_per_init): lower rollout.shards"
            )

    def _check_opponents(self) -> None:
        """What an opponent mix (`opponents.selfplay_fraction` < 1) needs of the config."""
        if self.train_backend != "torch":
            raise ValueError("opponents.selfplay_fraction < 1 needs train_backend: torch")
        if self.rollout.seats is not None:
            raise ValueError(
                "set either rollout.seats or opponents.selfplay_fraction < 1, not both"
            )
        if self.opponents.difficulty is None:
            raise ValueError(
                "opponents.selfplay_fraction < 1 needs opponents.difficulty.pool: the opponents, "
                f"weakest first (scripted agents of {self.game.name}: "
                f"{sorted(self.game.cls.agents)}, or past-<k>)"
            )
        scripted = sorted(self.game.cls.agents)
        unknown = [
            name
            for name in self.opponents.difficulty.pool
            if name not in scripted and past_steps(name) is None
        ]
        if unknown:
            raise ValueError(
                f"opponents.difficulty.pool names {unknown}, which are not scripted agents of "
                f"{self.game.name} ({scripted}) nor earlier checkpoints `past-<k>` (k >= 1, e.g. "
                "past-1: the policy of the previous iteration)"
            )

    def _check_verl(self) -> None:
        """What `train_backend: verl` needs of the rest of the config."""
        v = self.verl
        if self.device == "cpu":
            raise ValueError("train_backend: verl needs GPUs; set device: cuda (or auto)")
        rows, seats = self.verl_rows_per_iteration, self.num_seats
        if rows < v.train_batch_size:
            need = -(-v.train_batch_size // seats) * seats * v.rollout_n
            raise ValueError(
                f"train_backend: verl: games_per_iteration={self.games_per_iteration} with "
                f"verl.rollout_n={v.rollout_n} gives {rows} (state x seat) rows per iteration, "
                f"fewer than verl.train_batch_size ({v.train_batch_size}), so verl would train "
                f"no step: set games_per_iteration >= {need} or lower verl.train_batch_size"
            )

    def for_step(self, step: str) -> PipelineConfig:
        """The config as `step`'s task uses it (step names as in STEP_RESOURCES): with
        `device: cuda`, a step whose pod requests no accelerator runs on the CPU image, so its
        device is cpu."""
        if self.device != "cuda" or step == "train-verl" or self.kubernetes.step_gpus(step):
            return self
        return self.model_copy(update={"device": "cpu"})

    @property
    def verl_states_per_iteration(self) -> int:
        """Train states one verl iteration plays: each seat of each state is a dataset row
        that verl plays `verl.rollout_n` times, `games_per_iteration` games in all."""
        return self.games_per_iteration // (self.verl.rollout_n * self.num_seats)

    @property
    def verl_rows_per_iteration(self) -> int:
        """verl dataset rows (state x seat) of one iteration."""
        return self.verl_states_per_iteration * self.num_seats

    @property
    def num_seats(self) -> int:
        """Seats of the game."""
        return len(self.game.cls.roles)

    @property
    def ws_train(self) -> dict[str, Any]:
        return self.warm_start.train if self.warm_start else {}

    @property
    def group_key(self) -> str:
        """The GRPO group key (`train.group_key`, else GRPOConfig's default)."""
        return self.grpo_config().group_key

    def grpo_config(self):  # -> sparring.train.GRPOConfig
        """`train` as a validated GRPOConfig on the pipeline's device.

        The sections stay plain dicts so that tasks which never train don't import the
        trainer (and verl: seconds per task); `build_pipeline` validates both up front.
        """
        from sparring.train import GRPOConfig

        return _section(GRPOConfig, "train", {**self.train, "device": self.device})

    def sft_config(self):  # -> sparring.sft.SFTConfig
        """`warm_start.train` as a validated SFTConfig on the pipeline's device."""
        from sparring.sft import SFTConfig

        return _section(SFTConfig, "warm_start.train", {**self.ws_train, "device": self.device})

    @classmethod
    def from_yaml(cls, path: str | Path | None = None) -> PipelineConfig:
        """The config in `path`; the embedded default (configs/pipeline.yaml) if None."""
        return cls.model_validate(yaml.safe_load(Path(path or DEFAULT_CONFIG).read_text()) or {})


def _section(cls: type[BaseModel], name: str, data: dict[str, Any]) -> Any:
    try:
        return cls.model_validate(data)
    except ValueError as e:
        raise ValueError(f"invalid {name} section of the pipeline config:\n{e}") from e
