"""`VerlConfig`, the settings of one verl GRPO run, and the names verl looks up.

Kept free of verl imports (verl takes seconds to import) so that `PipelineConfig`, which every
pipeline task parses, can validate a `verl:` section without importing verl.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from sparring.games import GameSpec
from sparring.samples import check_group_key

AGENT_NAME = "sparring_selfplay"
"""The agent loop registered in `sparring.verl_backend.agent_loop`."""
ESTIMATOR_NAME = "sparring_group"
"""The advantage estimator registered in `sparring.verl_backend.estimator`."""
LOOP_MANAGER = "sparring.verl_backend.estimator.GroupLabelManager"
"""verl's agent-loop manager, subclassed to hand each row's group label to the estimator."""
ROUTE_GROUP_KEYS = ("init_seat", "role")
"""Generic group keys a verl row carries (`sparring.verl_backend.data`), besides the game's
own `extra_group_keys`. `game`, `init` and `batch` are not among them: each row replays its
own games for one seat."""


def verl_group_key(game: GameSpec, key: str) -> str:
    """`key` under its current name (a game's synonym or deprecated alias resolved) if a verl
    row of `game` can carry it; else a ValueError naming the keys that work."""
    valid = [*ROUTE_GROUP_KEYS, *game.cls.extra_group_keys]
    try:
        resolved = check_group_key(game, key)
    except ValueError:
        resolved = None
    if resolved not in valid:
        raise ValueError(
            f"verl.group_key={key!r}: the verl route groups {game.name}'s rows by one of "
            f"{valid}; use train_backend: torch with train.group_key for the others"
        )
    return resolved


class RayJobSettings(BaseModel):
    """How the verl task runs verl on a KubeRay RayJob (verl.nnodes > 1; sparring.verl_backend.rayjob)."""

    model_config = ConfigDict(extra="forbid")
    shared_pvc: str | None = None
    """ReadWriteMany PVC mounted at `shared_path` on the verl task and on every Ray pod: the
    model, the dataset rows and verl's FSDP checkpoints (every rank writes its shard there) go
    through it. Required when nnodes > 1."""
    shared_path: str = "/mnt/sparring-shared"
    namespace: str | None = None
    """Namespace of the RayJob; None = the verl task pod's own namespace."""
    head_cpu: str = "8"
    head_memory: str = "32Gi"
    """The head runs verl's driver (TaskRunner) and no GPU work."""
    worker_cpu: str = "32"
    worker_memory: str = "256Gi"
    """Per worker pod (one per node, `n_gpus_per_node` GPUs each)."""
    timeout_seconds: int = Field(24 * 3600, ge=60)
    """The RayJob's activeDeadlineSeconds, and how long the task waits for it."""
    poll_seconds: float = Field(10.0, gt=0)
    """How often the task reads the RayJob status and the new log lines."""
    keep_failed: bool = False
    """Keep a failed or timed-out RayJob and its Ray cluster for debugging (their GPUs stay
    held until `kubectl delete rayjob <name>`); by default the task deletes the RayJob however
    it ended."""
    log_tail: int = Field(40, ge=1)
    """Log lines quoted in the task's error when the RayJob fails."""


class VerlConfig(BaseModel):
    """Settings of one verl GRPO run (train.backend: verl)."""

    n_gpus_per_node: int = Field(8, ge=1)
    nnodes: int = Field(1, ge=1)
    """1: verl runs inside the verl task's pod. >1: the task runs verl on a KubeRay RayJob
    with `nnodes` worker pods of `n_gpus_per_node` GPUs each (`rayjob`)."""
    rayjob: RayJobSettings = Field(default_factory=RayJobSettings)
    rollout_n: int = Field(8, ge=2)
    """Plays per (state, seat) row: the GRPO group size."""
    train_batch_size: int = Field(64, ge=1)
    """Rows (state x seat) per step; the step trains on train_batch_size * rollout_n games."""
    ppo_mini_batch_size: int = Field(16, ge=1)
    micro_batch_size_per_gpu: int = Field(2, ge=1)
    lr: float = Field(1e-6, gt=0)
    kl_coef: float = Field(0.001, ge=0)
    """KL-to-reference loss weight (low_var_kl); 0 turns the KL loss and the ref model off."""
    group_key: str = "init_seat"
    """The GRPO group of each row: `init_seat` (same state, same seat: verl's own uid
    groups), `role`, or one of the game's `extra_group_keys` (Diplomacy's `country` pools a
    power's rows across states); checked against the game by the recipe (`verl_group_key`)."""
    norm_adv_by_std: bool = True
    tp_size: int = Field(1, ge=1)
    """SGLang tensor-parallel size of each rollout replica."""
    gpu_memory_utilization: float = Field(0.5, gt=0, lt=1)
    """SGLang's share of each GPU (the FSDP actor shares the GPU between phases)."""
    max_prompt_length: int = Field(1024, ge=16)
    max_response_length: int = Field(4096, ge=16)
    """Whole-game budget after the focal seat's first reply (all turns, both seats)."""
    max_new_tokens: int = Field(256, ge=1)
    """Per-turn cap."""
    ray_num_cpus: int | None = Field(None, ge=1)
    """Logical CPUs of the Ray cluster main_ppo starts on one node (None = the machine's cores).
    TransferQueue's storage actors each hold one: a machine with few cores needs more."""
    total_epochs: int = Field(1, ge=1)
    save_freq: int = Field(10, ge=1)
    test_freq: int = Field(10, ge=1)
    project_name: str = "sparring"
    experiment_name: str = "selfplay"

    @model_validator(mode="after")
    def _check(self) -> VerlConfig:
        if self.train_batch_size % self.ppo_mini_batch_size:
            raise ValueError(
                f"train_batch_size ({self.train_batch_size}) must be a multiple of "
                f"ppo_mini_batch_size ({self.ppo_mini_batch_size})"
            )
        if self.n_gpus_per_node % self.tp_size:
            raise ValueError(
                f"n_gpus_per_node ({self.n_gpus_per_node}) must be a multiple of tp_size "
                f"({self.tp_size})"
            )
        if self.nnodes > 1 and not self.rayjob.shared_pvc:
            raise ValueError(
                f"verl.nnodes={self.nnodes} runs verl on a KubeRay RayJob, whose pods share the "
                "model, data and checkpoints through a ReadWriteMany volume: set "
                "verl.rayjob.shared_pvc to its PersistentVolumeClaim"
            )
        if self.nnodes > 1 and self.ray_num_cpus:
            raise ValueError(
                "verl.ray_num_cpus sizes the Ray cluster main_ppo starts on one node; with "
                "nnodes > 1 verl joins the RayJob's cluster (size it with verl.rayjob.*_cpu)"
            )
        if self.max_new_tokens >= self.max_response_length:
            raise ValueError("max_new_tokens must be below max_response_length (a whole game)")
        return self
