"""What an update trains with: the GRPO and SFT hyperparameters. Light (pydantic only), so that
validating a pipeline config imports neither torch nor verl; `sparring.train` and
`sparring.sft` run them."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from sparring.games.base import LEARNER

# verl's agg_loss modes and kl_penalty types (verl.trainer.ppo.core_algos), by name.
LOSS_AGG_MODES = (
    "token-mean",
    "token-sum",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)
KL_TYPES = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")


class OptimConfig(BaseModel):
    """Optimizer and batching settings shared by GRPO (`GRPOConfig`) and SFT (`SFTConfig`)."""

    model_config = ConfigDict(extra="forbid")

    lr: float = Field(1e-5, gt=0)  # AdamW learning rate
    weight_decay: float = Field(0.0, ge=0)  # AdamW decoupled weight decay
    lr_schedule: Literal["constant", "cosine"] = "constant"  # cosine decays to 0 over the update
    epochs: int = Field(1, ge=1)  # passes over the batch: PPO epochs (GRPO), data epochs (SFT)
    mini_batch_size: int = Field(32, ge=1)  # sequences per optimizer step
    micro_batch_size: int = Field(8, ge=1)  # sequences per forward/backward (grad accumulation)
    loss_agg_mode: str = "token-mean"  # verl agg_loss mode, one of sparring.LOSS_AGG_MODES
    max_grad_norm: float = Field(1.0, gt=0)  # clip the global grad norm to this
    # Longer rows are cut; a row whose reward token is cut off is dropped (`train/dropped_rows`).
    max_seq_len: int | None = Field(None, ge=16)
    seed: int = 0  # mini-batch shuffling and torch seed
    bf16: bool = True  # bfloat16 autocast on CUDA (ignored on CPU)
    # bfloat16 autocast on CPU, the LM head and log-softmax kept fp32: ~1.45x a SmolLM2 step
    # where the CPU has bf16 instructions (AVX512-BF16, AMX), slower where not; auto = only
    # where a probe finds bf16 faster (sparring.peak_flops.cpu_bf16). docs/training.md.
    cpu_bf16: bool | Literal["auto"] = False
    # Weights' dtype, and the saved checkpoint's. bfloat16 halves weights, grads and AdamW state
    # but rounds away updates below ~0.4% of a weight (lr 1e-5 mostly is): sparring.policy_model.
    param_dtype: Literal["float32", "bfloat16"] = "float32"
    gradient_checkpointing: bool = False  # recompute decoder layers in backward: less memory
    lora_rank: int = Field(0, ge=0)  # >0: train LoRA adapters only; checkpoints are merged
    lora_alpha: float | None = Field(None, gt=0)  # LoRA scale numerator; None = 2 * lora_rank

    @model_validator(mode="after")
    def _check_batches(self) -> OptimConfig:
        if self.micro_batch_size > self.mini_batch_size:
            raise ValueError(
                f"micro_batch_size ({self.micro_batch_size}) must be <= mini_batch_size "
                f"({self.mini_batch_size}); lower micro_batch_size or raise mini_batch_size"
            )
        if self.loss_agg_mode not in LOSS_AGG_MODES:
            raise ValueError(
                f"unknown loss_agg_mode {self.loss_agg_mode!r}; choose from {LOSS_AGG_MODES}"
            )
        return self


class GRPOConfig(OptimConfig):
    """Hyperparameters of one GRPO update. The defaults are the recommended values."""

    group_key: str = "init"  # GRPO group: game, init, role, batch, a game's own key, any column
    # A samples column (a group key such as a game's seat label): every mini-batch takes as
    # many rows of each of its values as it can, up to one (sparring.train.schedule), while
    # every row is still used once per epoch. None = plain shuffled mini-batches.
    balance_by: str | None = None
    norm_adv_by_std: bool = True  # divide by the group std (GRPO); False = Dr. GRPO (centre only)
    singleton_groups: Literal["zero", "batch"] = "zero"  # size-1 groups: see sparring.grpo
    clip_ratio: float = Field(0.2, gt=0, lt=1)  # PPO clip epsilon (lower side)
    clip_ratio_high: float | None = Field(None, gt=0)  # upper clip epsilon; None = clip_ratio
    # seq-mean-token-mean: every sequence weighs the same. token-mean lets long failed games
    # outweigh short wins (docs/results.md measures it).
    loss_agg_mode: str = "seq-mean-token-mean"
    kl_coef: float = Field(0.0, ge=0)  # weight of KL(policy || reference); 0 = no reference
    kl_type: str = "low_var_kl"  # verl kl_penalty: kl/k1, abs, mse/k2, low_var_kl/k3 (+ suffix ok)
    entropy_coef: float = Field(0.0, ge=0)  # entropy bonus weight (entropy is logged either way)
    # Evens out how often the update visits each decision state (a reply's exact token prefix:
    # in Kuhn Poker an information state): each reply's tokens weigh (replies in the batch with
    # its prefix) ** -state_balance, averaging 1 (sparring.grpo.state_weights). 0 = the plain
    # update; 1 = every state the same total weight, so a state self-play seldom reaches
    # learns as fast as a common one. Changes nothing where no two replies share a prefix.
    state_balance: float = Field(0.0, ge=0, le=1)
    # Dr. GRPO's divisor (loss_agg_mode seq-mean-token-sum-norm): a constant, so that a step's
    # size doesn't follow its mini-batch's longest row; a recipe sets its max_context_tokens.
    # None = each mini-batch's padded length (verl's default).
    loss_scale_factor: int | None = Field(None, ge=1)
    policy: str | None = LEARNER  # train the rows whose `policy` is this (None = all)
    # grpo: group advantages under `group_key`. rae: SPIRAL's role-conditioned advantage, an EMA
    # reward baseline per value of `rae_key` kept across updates with the checkpoint
    # (sparring.rae); `group_key` then only names the groups whose stats are logged.
    advantage: Literal["grpo", "rae"] = "grpo"
    rae_key: str = "role"  # the samples column whose values get their own baseline
    rae_decay: float = Field(0.95, gt=0, lt=1)  # EMA decay per update (SPIRAL's alpha)
    # Credit of a reply the game rejected (the seat then retried), by the samples'
    # rejected_mask: episode = the episode's advantage like every other token; exclude = at
    # most 0 (a rejected reply never shares a win); penalty = `rejected_penalty` whatever
    # the episode, which also teaches the protocol when every reward ties.
    rejected_credit: Literal["episode", "exclude", "penalty"] = "episode"
    rejected_penalty: float = Field(-1.0, le=0)  # rejected_credit: penalty's advantage
    # fresh: a new AdamW (and lr schedule) every update. carry: AdamW's moments and the
    # schedule's step continue from the previous update (`optimizer.pt`, stored beside the
    # checkpoint and never registered); the cosine schedule then spans `lr_schedule_updates`
    # updates (a recipe sets its iterations). Full fine-tuning only, for now. With fresh and
    # lr_schedule_updates N > 1, update k takes the (k mod N)-th share of one schedule.
    optimizer_state: Literal["fresh", "carry"] = "fresh"
    lr_schedule_updates: int = Field(1, ge=1)
    # Rollout correction, verl's `algorithm.rollout_correction` by name and meaning (defaults
    # too): the mismatch between the engine's log-probs and the trainer's is always measured
    # (`train/mismatch_kl`); these correct for it. Both need the samples' rollout_log_probs.
    # Off by default as in verl: the CPU engine matches the trainer to ~1e-5 (docs/training.md).
    rollout_is: Literal["token", "sequence"] | None = None  # truncated IS weight on the loss
    rollout_is_threshold: float = Field(2.0, gt=1)  # TIS cap: weight min(pi_old/pi_rollout, cap)
    bypass_mode: bool = False  # old log-probs = the rollout's: skip the trainer's recompute pass
    # Dynamic sampling (DAPO): the update drops every group under `group_key` whose advantages
    # are all 0 (tied rewards; singletons under singleton_groups: zero), which would otherwise
    # count in the loss's normaliser and cost a forward and backward for nothing
    # (`train/dropped_groups`, `train/dropped_group_frac`). Off by default: without a top-up the
    # update shrinks with the ties, so each kept row weighs more (docs/training.md).
    dynamic_sampling: bool = False
    # > 0 (with dynamic_sampling): the loop's rollout plays further train states, one round of
    # the iteration's states at a time, until this many groups carry signal or
    # `max_topup_rounds` rounds are played (torch route, one rollout shard, no opponent mix).
    min_groups: int = Field(0, ge=0)
    max_topup_rounds: int = Field(1, ge=1)
    # Cross-role transfer (seed 001): the loss gains transfer_weight x the mean, over the
    # `transfer_pairs` with rows of both roles in a micro-batch, of the mean squared difference
    # between the two roles' mean final hidden states over their prompt tokens
    # (sparring.grpo.transfer_loss; `train/transfer_loss`). 0 = off: the plain update, exactly.
    transfer_weight: float = Field(0.0, ge=0)
    # Pairs of the samples' `role` values that the loss pulls together; a recipe fills in its
    # game's `transfer_pairs` when transfer_weight > 0 and this is None.
    transfer_pairs: list[tuple[str, str]] | None = None
    # Run each shared prompt once per micro-batch: the rows one seat played from one game state
    # (the same `init_id` and `seat`) are packed behind the prefix they share, which every
    # forward and backward then computes once (sparring.shared_prefix; verl's
    # use_prefix_grouper). The same loss and gradients, up to float rounding.
    share_prefix: bool = False
    # rows: each mini-batch is a shuffled draw of rows. prompts: of chunks of micro_batch_size
    # rows of one prompt group (the rows of one init_id and seat), in shuffled order; a chunk
    # the size of a group gives verl's mini-batches, whole groups of a prompt's n responses.
    # With share_prefix each chunk's prompt then runs once per step.
    mini_batches: Literal["rows", "prompts"] = "rows"

    @model_validator(mode="after")
    def _check(self) -> GRPOConfig:
        if self.dynamic_sampling and self.advantage == "rae":
            raise ValueError(
                "dynamic_sampling drops the groups whose group advantages are all 0, but with "
                "advantage: rae no row's advantage comes from its group (and dropping rows would "
                "bias the role baselines); set dynamic_sampling: false or advantage: grpo"
            )
        if self.min_groups and not self.dynamic_sampling:
            raise ValueError(
                f"min_groups={self.min_groups} tops the rollout up for dynamic sampling, which "
                "is off; set dynamic_sampling: true or min_groups: 0"
            )
        if self.optimizer_state == "carry" and self.lora_rank:
            raise ValueError(
                "optimizer_state: carry needs full fine-tuning (lora_rank: 0): a merged LoRA "
                "checkpoint can't continue its adapter yet"
            )
        if self.kl_type.removesuffix("+") not in KL_TYPES:
            raise ValueError(f"unknown kl_type {self.kl_type!r}; choose from {KL_TYPES}")
        if self.group_key.strip() != self.group_key or not self.group_key:
            raise ValueError(f"group_key {self.group_key!r} must be a column name or 'batch'")
        if self.balance_by is not None and (
            self.balance_by in ("", "batch") or self.balance_by.strip() != self.balance_by
        ):
            raise ValueError(
                f"balance_by {self.balance_by!r} must name a samples column whose values the "
                "mini-batches balance (e.g. `role`); or set balance_by: null"
            )
        if self.transfer_weight > 0 and not self.transfer_pairs:
            raise ValueError(
                f"transfer_weight={self.transfer_weight} needs transfer_pairs (pairs of the "
                "samples' role values); a recipe fills in its game's defaults; or set "
                "transfer_weight: 0"
            )
        if any(a == b for a, b in self.transfer_pairs or ()):
            raise ValueError(
                f"transfer_pairs {self.transfer_pairs} pairs a role with itself; each pair "
                "names two different roles"
            )
        if self.share_prefix and self.transfer_weight:
            raise ValueError(
                "share_prefix packs rows by prompt, but the transfer loss pairs the rows of a "
                "micro-batch as given; set share_prefix: false or transfer_weight: 0"
            )
        if self.mini_batches == "prompts" and self.balance_by is not None:
            raise ValueError(
                f"mini_batches: prompts keeps prompt chunks whole, balance_by "
                f"{self.balance_by!r} mixes rows by label; choose one"
            )
        if self.bypass_mode and self.rollout_is is not None:
            raise ValueError(
                f"bypass_mode uses the rollout log-probs as the old ones, so PPO's ratio already "
                f"is pi/pi_rollout and rollout_is={self.rollout_is!r} would weight it twice (verl "
                "ignores it there); set rollout_is: null or bypass_mode: false"
            )
        return self


class SFTConfig(OptimConfig):
    """Hyperparameters of one SFT run (every samples row is trained, whoever played it)."""

    lr: float = Field(1e-4, gt=0)  # higher than GRPO's: a warm start moves a model far
    # Exactly this many optimizer steps: shuffled passes over the data, as many as it takes,
    # the last cut short (`epochs` is then unused). None = `epochs` passes.
    steps: int | None = Field(None, ge=1)
    # Score each row at the temperature it was sampled at, so that the model then samples at
    # that temperature as the players did: distilling a sampled policy (the loop's iterates,
    # `average`). False: plain softmax, imitating moves that had no temperature (scripted).
    at_sampling_temperature: bool = False
    # Identical rows train once, weighted by their count: the same loss in fewer forward
    # passes where play repeats few distinct rows (a small game). token-mean or token-sum only:
    # a per-sequence mean would cancel the weights.
    merge_duplicates: bool = False

    @model_validator(mode="after")
    def _check_merge(self) -> SFTConfig:
        if self.merge_duplicates:
            self.check_weighted("merge_duplicates weights each row by its count")
        return self

    def check_weighted(self, why: str) -> None:
        """Refuse a loss aggregation that would cancel per-row weights (`why` they are used)."""
        if self.loss_agg_mode not in ("token-mean", "token-sum"):
            raise ValueError(f"{why}, which loss_agg_mode {self.loss_agg_mode!r} cancels; use "
                             "token-mean or token-sum")  # fmt: skip
