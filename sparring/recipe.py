"""The recipe: what one self-play run trains, apart from where it runs (`sparring.loop.config`).

    recipe = Recipe.model_validate(yaml.safe_load(open("configs/pipeline.yaml")))

A recipe names the game once (`game: {name, params}`); the game-init, rollout and eval
sections are the stages' own configs and are built with that game, so a section that sets
another game is an error. The top-level `device` is every stage's; the loop passes it to the
trainers as an argument.
Light to import (pydantic, no torch, verl or MLflow): `sparring schema` prints its JSON schema.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from sparring.evaluate import EVAL_MODES, EvalConfig
from sparring.game_init import GameInitConfig
from sparring.games import GameSpec
from sparring.opponents import DifficultyConfig, past_steps
from sparring.population import PopulationConfig
from sparring.rollout import RolloutConfig
from sparring.samples import check_group_key
from sparring.train_config import GRPOConfig, SFTConfig
from sparring.verl_backend.config import VerlConfig, verl_group_key


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


class WarmStart(_Strict):
    """Supervised warm start of the initial model on scripted self-play (before iteration 0)."""

    agent: str | None = None  # scripted agent that plays every seat; None = the game's default
    num_states: int = Field(32, ge=1)  # train initial states it plays (once each)
    train: SFTConfig = Field(default_factory=SFTConfig)  # SFT settings (`device` is the top's)


class SFTControl(_Strict):
    """The SFT control (`bench/learning.py --control sft`): each iteration spends its budget on
    more SFT from the warm start's teacher instead of rollout and GRPO. The teacher
    (`warm_start.agent`) plays each of the iteration's train states once (those its rollout
    would play) and the model is fine-tuned on those games with `warm_start.train`, for
    `steps[i]` optimizer steps in iteration i, or as many as fit in `seconds[i]` at the previous
    SFT's seconds per step (the warm start's, then the previous round's). `run_loop` only."""

    steps: list[int] | None = None  # optimizer steps per iteration (the GRPO arm's); 0 = none
    seconds: list[float] | None = None  # or wall seconds per iteration (the GRPO arm's)
    lr: float | None = Field(None, gt=0)  # the rounds' learning rate; None = warm_start.train's

    @model_validator(mode="after")
    def _one_budget(self) -> SFTControl:
        if (self.steps is None) == (self.seconds is None):
            raise ValueError("sft_control: set either steps or seconds (one per iteration)")
        if any(b < 0 for b in self.steps or self.seconds or []):
            raise ValueError("sft_control: a budget can't be negative")
        return self

    @property
    def budget(self) -> list[float]:
        """The budget of each iteration, in steps or in seconds."""
        return list(self.steps if self.steps is not None else self.seconds or [])


def _distilling() -> SFTConfig:
    """`Average.train`'s default: configs/sft-average.yaml's settings."""
    return SFTConfig(lr=5e-4, lr_schedule="cosine", steps=24, mini_batch_size=64, lora_rank=16,
                     at_sampling_temperature=True, merge_duplicates=True)  # fmt: skip


class Average(_Strict):
    """After the last iteration, the iterates as one model (`sparring.loop.tasks.average`):
    the last iterate fine-tuned to play as the mixture of the iterates would (one of them
    drawn per game), the average that no-regret self-play converges in, where the last
    iterate may cycle (NFSP's average policy, fitted once after the run). It is evaluated on
    val like an iteration, registered under the alias `average` (and as champion if it scores
    best), and with test states it is the final model the test scores."""

    source: Literal["rollouts", "tables"] = "rollouts"
    """What it is fitted to. `rollouts`: every iteration's stored rollout, each played by that
    iteration's model, at the temperature it was sampled at (any game; the mixture as far as
    the rollouts sample it, so a rarely reached state keeps its sampling noise). `tables`:
    the exact mixture of the updated models' policies as each evaluation read them out whole
    (games that `reads_policy_table`: Kuhn Poker), both replies of every decision weighted by
    the mixture's probability of them, at the evaluation's temperature."""
    weights: Literal["uniform", "linear"] = "uniform"
    """How the iterates weigh in the mixture: `uniform`, or `linear`, the t-th weighing t (CFR+'s
    linear averaging: the early iterates, far from where the run settles, count less). With
    `source: rollouts` each iteration's rows are weighted so."""
    train: SFTConfig = Field(default_factory=_distilling)
    """The distillation's SFT (`device` is the top's); a field not given keeps
    configs/sft-average.yaml's value. `at_sampling_temperature` should stay on, or the model
    fits at T = 1 the moves that were sampled (or read out) at the rollout's (evaluation's) T."""

    def mixture_weights(self, n: int) -> list[float]:
        """The weights of `n` iterates, in the order they were made."""
        return [float(t) if self.weights == "linear" else 1.0 for t in range(1, n + 1)]

    @model_validator(mode="before")
    @classmethod
    def _over_the_defaults(cls, data: Any) -> Any:
        """`train` given in part: the rest from `_distilling`, not from SFTConfig's defaults."""
        if isinstance(data, dict) and isinstance(data.get("train"), dict):
            return data | {"train": _distilling().model_dump(exclude_unset=True) | data["train"]}
        return data


class PipelineRollout(RolloutConfig):
    """The `rollout:` section: the library's RolloutConfig plus the fan-out."""

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


# The sections built with the recipe's game, by their path in the YAML.
GAME_SECTIONS = (("game_init",), ("rollout",), ("eval", "rollout"))


class Recipe(_Strict):
    """What is trained: the game, the model, the warm start, the rollout, GRPO, the evaluation,
    the opponents and the schedule (see configs/pipeline.yaml)."""

    game: GameSpec = Field(default_factory=GameSpec)
    """The game and its rules, {name, params}: every stage's game."""
    model: str = "tiny"
    """Initial model: "tiny", a hub name, a path, s3://… or models:/name@alias."""
    warm_start: WarmStart | None = None
    """SFT on scripted games before the first iteration; None = off."""
    iterations: int = Field(2, ge=1)
    """Rollout → train → evaluate → register rounds."""
    first_iteration: int = Field(0, ge=0)
    """Index of the first round (the campaign driver sets it)."""
    games_per_iteration: int = Field(64, ge=1)
    """Self-play games per rollout."""
    evaluate_start: bool = False
    """Evaluate the starting model (after the warm start) before the first update, as
    iteration first_iteration - 1, so that a run's gain is measured from where GRPO began."""
    device: str = "auto"
    """cpu, cuda or auto: every stage's device."""
    game_init: GameInitConfig = Field(default_factory=GameInitConfig)
    """Initial states: train and val counts, seed."""
    rollout: PipelineRollout = Field(default_factory=PipelineRollout)
    """Self-play: plays per state, sampling (iteration i samples with seed + i), batching."""
    opponents: Opponents = Field(default_factory=Opponents)
    """Pure self-play, or a share of games against an opponent pool."""
    population: PopulationConfig | None = None
    """A population of `size` policies trained at once, each on the seats it played, members
    seated together and rated (sparring.population, sparring.loop.population); None = one
    learner."""
    magnet_every: int = Field(0, ge=0)
    """The KL anchor of `train.kl_coef` (the magnet) is the starting model; N > 0 moves it to
    the newest trained model after every N-th iteration (magnetic mirror descent's moving
    magnet: the anchor keeps the policy mixed without holding it near the start). 0 = the
    start throughout. A campaign's block anchors at its own starting model first."""
    train: GRPOConfig = Field(default_factory=GRPOConfig)
    """GRPO settings, among them the group key (game, init, role, batch, or one of the game's
    `extra_group_keys`)."""
    train_backend: Literal["torch", "verl"] = "torch"
    """Who trains each iteration. torch: the rollout step, then `sparring.train` (CPU or one
    GPU). verl: one task per iteration runs verl's main_ppo with online self-play inside verl
    (sparring.verl_backend) on `verl.n_gpus_per_node` GPUs; `rollout` and `train` are unused."""
    verl: VerlConfig = Field(default_factory=VerlConfig)
    """Settings of `train_backend: verl`."""
    sft_control: SFTControl | None = None
    """The SFT control instead of GRPO (a bench's control arm, in-process only); None = GRPO."""
    average: Average | None = None
    """After the last iteration, the iterates distilled into one model, evaluated and
    registered (alias `average`); None = the last iterate is the run's model."""
    eval: EvalConfig = Field(default_factory=EvalConfig)
    """Evaluation: modes, val games, sampling."""
    registered_model: str | None = None
    """MLflow registered model; None = sparring-<game>-<eval_key>, so that recipes whose
    scores can't be compared never compete for one champion."""
    champion_metric: str = "eval/selfplay/all/normalized_reward"
    """The eval metric that picks the `champion` (on val states): a version takes the alias
    when its paired gain over the champion on the same val games exceeds its standard error
    (sparring.registry.publish)."""

    @model_validator(mode="before")
    @classmethod
    def _build_sections(cls, data: Any) -> Any:
        """Build the game sections with the top-level game, and resolve the names that
        depend on the game (the group key's alias, the warm start's agent, the model name)."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        game = GameSpec.model_validate(data.get("game") or {})
        for path in GAME_SECTIONS:
            data = _with_game(data, path, game)
        choose = _as_dict(data.get("rollout")).get("choose_legal")
        if choose is not None:  # evaluation plays as training does, unless it says otherwise
            section = _as_dict(data.get("eval"))
            rollout = {"choose_legal": choose, **_as_dict(section.get("rollout"))}
            data["eval"] = {**section, "rollout": rollout}
        train = _as_dict(data.get("train"))
        for name, section in (("train", train), ("warm_start.train", _ws_train(data))):
            if "device" in section:
                raise ValueError(
                    f"{name}.device is set; set the top-level `device` (used by every stage)"
                )
        key = check_group_key(game, train.get("group_key", game.cls.default_group_key))
        data["train"] = {**train, "group_key": key, **_rollout_correction(data, train)}
        verl = _as_dict(data.get("verl"))
        if "group_key" in verl:
            data["verl"] = {**verl, "group_key": verl_group_key(game, verl["group_key"])}
        if train.get("balance_by") not in (None, "batch"):  # the samples carry the column
            data["train"]["balance_by"] = check_group_key(game, train["balance_by"])
        if train.get("transfer_weight") or train.get("transfer_pairs"):
            data["train"]["transfer_pairs"] = transfer_pairs(game, train.get("transfer_pairs"))
        if data["train"].get("optimizer_state") == "carry":  # one lr schedule for the run
            data["train"].setdefault(
                "lr_schedule_updates", data.get("iterations", _default(cls, "iterations"))
            )
        if data["train"].get("loss_scale_factor") is None:  # Dr. GRPO: one divisor per run
            rollout = _as_dict(data.get("rollout"))
            context = rollout.get(
                "max_context_tokens", _default(RolloutConfig, "max_context_tokens")
            )
            data["train"]["loss_scale_factor"] = data["train"].get("max_seq_len") or context
        ws = data.get("warm_start")
        if ws is not None and _as_dict(ws).get("agent") is None:
            data["warm_start"] = {**_as_dict(ws), "agent": game.cls.default_opponent}
        return data

    @model_validator(mode="after")
    def _check(self) -> Recipe:
        if self.games_per_iteration % self.rollout.games_per_init:
            raise ValueError(
                f"games_per_iteration ({self.games_per_iteration}) must be a multiple of "
                f"rollout.games_per_init ({self.rollout.games_per_init})"
            )
        if self.game_init.num_train < 1 or self.game_init.num_val < 1:
            raise ValueError("game_init.num_train and game_init.num_val must both be >= 1")
        if not self.champion_metric.startswith("eval/"):
            raise ValueError(f"champion_metric {self.champion_metric!r} must be an eval/* metric")
        mode = self.champion_metric.split("/")[1]
        if mode in EVAL_MODES and mode not in self.eval.modes:
            raise ValueError(f"champion_metric {self.champion_metric!r} is scored in eval mode "
                             f"{mode!r}, which eval.modes {self.eval.modes} does not play")  # fmt: skip
        if self.registered_model is None:
            self.registered_model = f"sparring-{self.game.name}-{self.eval_key}"
        if self.rollout.choose_legal and self.train_backend != "torch":
            raise ValueError("rollout.choose_legal is for the torch route's rollout, not verl's")
        if self.train.balance_by is not None and self.train_backend != "torch":
            raise ValueError(
                f"train.balance_by={self.train.balance_by!r} forms the torch update's "
                "mini-batches; verl forms its own: set train_backend: torch or balance_by: null"
            )
        if self.train.transfer_weight and self.train_backend != "torch":
            raise ValueError(
                f"train.transfer_weight={self.train.transfer_weight} is an auxiliary loss of the "
                "torch update, and verl's actor computes its own loss: set train_backend: torch "
                "or transfer_weight: 0"
            )
        if self.train.state_balance and self.train_backend != "torch":
            raise ValueError(
                f"train.state_balance={self.train.state_balance} weighs the torch update's "
                "loss, and verl's actor computes its own: set train_backend: torch or "
                "state_balance: 0"
            )
        if self.magnet_every:
            self._check_magnet()
        if self.train_backend == "verl":
            self._check_verl()
        if self.rollout.shards > 1:
            self._check_shards()
        if self.opponents.mixed:
            self._check_opponents()
        if self.train.min_groups:
            self._check_topup()
        if self.sft_control:
            self._check_sft_control()
        if self.population:
            self._check_population()
        if self.average:
            self._check_average()
        return self

    def _check_average(self) -> None:
        """The distillation reads one learner's rollout samples, or its evaluations' tables."""
        assert self.average is not None
        needs = {
            "train_backend: torch (verl keeps its rollouts inside its task)": (
                self.train_backend == "torch"
            ),
            "population: null (one learner's iterates)": self.population is None,
            "sft_control: null (it plays no rollout)": self.sft_control is None,
        }
        if self.average.source == "tables":
            whole = f"a game whose evaluation reads out its whole policy (not {self.game.name})"
            needs[whole] = self.game.cls.reads_policy_table
        _require(f"average distills one learner's {self.average.source}", needs, "average: null")

    def _check_population(self) -> None:
        """What a population (sparring.loop.population) needs of the recipe."""
        assert self.population is not None
        self.population.check_roles(self.game.cls.roles)
        others = {
            "train_backend: torch": self.train_backend == "torch",
            "rollout.shards: 1": self.rollout.shards == 1,
            "pure self-play (opponents.selfplay_fraction: 1)": not self.opponents.mixed,
            "rollout.seats: null": self.rollout.seats is None,
            "train.min_groups: 0": not self.train.min_groups,
            "train.optimizer_state: fresh": self.train.optimizer_state != "carry",
            "sft_control: null": self.sft_control is None,
        }
        _require(
            "population seats its members in every game and trains each on its own seats",
            others,
            "population: null",
        )

    def _check_magnet(self) -> None:
        """A moving magnet needs a KL term to anchor, on the one learner of the torch route."""
        needs = {
            "train.kl_coef > 0 (the magnet is the KL term's reference)": self.train.kl_coef > 0,
            "train_backend: torch (verl keeps its own reference)": self.train_backend == "torch",
            "population: null (each member would need its own magnet)": self.population is None,
        }
        _require(f"magnet_every={self.magnet_every} moves the KL anchor", needs, "magnet_every: 0")

    def _check_sft_control(self) -> None:
        """The SFT control needs the warm start's teacher, and one budget per iteration."""
        if self.warm_start is None or self.train_backend != "torch":
            raise ValueError(
                "sft_control trains on the warm start's teacher in place of the torch GRPO "
                "update: set warm_start and train_backend: torch, or sft_control: null"
            )
        if len(self.sft_control.budget) != self.iterations:
            raise ValueError(
                f"sft_control has {len(self.sft_control.budget)} budgets for {self.iterations} "
                "iterations: give one per iteration"
            )

    def _check_topup(self) -> None:
        """Where dynamic sampling's top-up (`train.min_groups` > 0) can play more games."""
        where = {
            "train_backend: torch (verl plays inside verl)": self.train_backend == "torch",
            "rollout.shards: 1 (a shard can't see the others' groups)": self.rollout.shards == 1,
            "opponents.selfplay_fraction: 1 (the mix seats a fixed set of states)": (
                not self.opponents.mixed
            ),
        }
        _require(
            f"train.min_groups={self.train.min_groups} tops the rollout up with more games",
            where,
            "train.min_groups: 0 (dynamic sampling then only drops the groups without signal)",
        )

    def _check_shards(self) -> None:
        """What the rollout fan-out (`rollout.shards` > 1) needs of the recipe."""
        shards = self.rollout.shards
        states = self.games_per_iteration // self.rollout.games_per_init
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
        """What an opponent mix (`opponents.selfplay_fraction` < 1) needs of the recipe."""
        if self.train_backend != "torch":
            raise ValueError("opponents.selfplay_fraction < 1 needs train_backend: torch")
        if self.rollout.seats is not None:
            raise ValueError(
                "set either rollout.seats or opponents.selfplay_fraction < 1, not both"
            )
        scripted = sorted(self.game.cls.agents)
        if self.opponents.difficulty is None:
            raise ValueError(
                "opponents.selfplay_fraction < 1 needs opponents.difficulty.pool: the opponents, "
                f"weakest first (scripted agents of {self.game.name}: {scripted}, or past-<k>)"
            )
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
        """What `train_backend: verl` needs of the rest of the recipe."""
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
    def eval_key(self) -> str:
        """What makes two champion scores comparable, hashed (8 hex digits): the game, the val
        states (seed and count), the evaluation's settings and the champion metric."""
        what = {
            "game": self.game.model_dump(mode="json"),
            "val": [self.game_init.seed, self.game_init.num_val],
            "eval": self.eval.model_dump(mode="json"),
            "metric": self.champion_metric,
        }
        return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:8]

    @property
    def num_seats(self) -> int:
        """Seats of the game."""
        return len(self.game.cls.roles)

    @property
    def group_key(self) -> str:
        """The GRPO group key."""
        return self.train.group_key


def transfer_pairs(game: GameSpec, pairs: Any) -> list[tuple[str, str]]:
    """`pairs` (the game's `transfer_pairs` when None) as a list; a ValueError naming any role
    the game lacks, or saying that the game has no default pairs."""
    roles = list(game.cls.roles)
    pairs = game.cls.transfer_pairs if pairs is None else pairs
    if not pairs:
        raise ValueError(
            f"train.transfer_weight is set but {game.name} has no default transfer_pairs: set "
            f"train.transfer_pairs to pairs of its roles {roles}"
        )
    named = {r for pair in pairs if isinstance(pair, list | tuple) for r in pair}
    if unknown := sorted(named - set(roles), key=str):
        raise ValueError(
            f"train.transfer_pairs names {unknown}, not roles of {game.name}; choose from {roles}"
        )
    return [tuple(pair) if isinstance(pair, list) else pair for pair in pairs]


def _require(what: str, needs: dict[str, bool], off: str) -> None:
    """A ValueError saying that `what` needs each unmet entry of `needs`, or `off`."""
    missing = [need for need, ok in needs.items() if not ok]
    if missing:
        raise ValueError(f"{what}, which needs {'; '.join(missing)}; or set {off}")


def _default(model: type[BaseModel], name: str) -> Any:
    return model.model_fields[name].default


def _as_dict(section: Any) -> dict[str, Any]:
    """A section as given: a mapping, or a model (its explicitly set fields)."""
    if isinstance(section, BaseModel):
        return section.model_dump(exclude_unset=True)
    return dict(section or {})


def _rollout_correction(data: dict[str, Any], train: dict[str, Any]) -> dict[str, Any]:
    """The train settings a sampler and a trainer at different precisions need (the engine's
    int8 or bf16 layers, the trainer's CPU bf16 autocast): the truncated importance sampling
    (`rollout_is`, token level unless set) corrects the update, and the trainer's own old
    log-probs measure the gap (`train/mismatch_kl`). In bf16 the engine's log-probs are close
    enough (mismatch KL about 1e-3) to serve as the old ones: `bypass_mode` skips that pass and
    PPO's clipped ratio against them is the correction; int8's (about .16) are not."""
    backend = _as_dict(_as_dict(data.get("rollout")).get("backend"))
    apart = [
        f"{name}={value!r}"
        for name, value in [
            ("rollout.backend.quantize", backend.get("quantize", "none")),
            ("train.cpu_bf16", train.get("cpu_bf16", False)),
        ]
        if value not in ("none", False)
    ]
    if not apart:
        return {}
    int8 = backend.get("quantize") == "int8"
    if train.get("bypass_mode") and not int8:
        return {}
    if train.get("bypass_mode") or ("rollout_is" in train and train["rollout_is"] is None):
        raise ValueError(
            f"{' and '.join(apart)}: the rollout's sampler and the trainer compute at "
            "different precisions, so the update needs the rollout correction: set "
            "train.rollout_is (token or sequence; token when unset)"
            + (
                " and bypass_mode: false (int8's log-probs are too far from the trainer's to "
                "be the old ones)"
                if int8
                else ", or bypass_mode: true"
            )
            + ", or drop those settings"
        )
    return {"rollout_is": train.get("rollout_is", "token")}


def _ws_train(data: dict[str, Any]) -> dict[str, Any]:
    return _as_dict(_as_dict(data.get("warm_start")).get("train"))


def _with_game(
    data: dict[str, Any], path: tuple[str, ...], game: GameSpec, name: str = ""
) -> dict[str, Any]:
    """`data` with the section at `path` built with `game`; an error if it names another."""
    name = f"{name}.{path[0]}" if name else path[0]
    section = _as_dict(data.get(path[0]))
    if len(path) > 1:
        return {**data, path[0]: _with_game(section, path[1:], game, name)}
    own = section.get("game")
    if own is not None and GameSpec.model_validate(own) != game:
        raise ValueError(
            f"{name}.game={own!r} differs from the top-level game={game!r}: set it once, at "
            "the top."
        )
    return {**data, path[0]: {**section, "game": game}}
