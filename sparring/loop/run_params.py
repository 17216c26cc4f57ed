"""Run parameters: what the KFP UI lets a user change at run time, each one a config field.

The compiled pipeline exposes `config` (the whole PipelineConfig as JSON) and one typed,
described parameter per entry of `RUN_PARAMETERS`. Each parameter's default is its field's
value in the compiled config, so there is ONE source of truth per value:

- a parameter left at its default leaves the config's field as it is;
- a changed parameter sets its field, unless the `config` parameter also changed that field to
  another value: then `start` fails and names both (no silent override).

Graph-shaping fields (iterations, warm start, train backend, opponent checkpoints, images,
GPUs and the rest of `kubernetes`) are fixed when the pipeline is compiled: the IR embeds
their `fingerprint`, and `start` rejects a `config` whose fingerprint differs.

    compiled = compile_time(cfg)                       # embedded in the IR as a constant
    cfg = resolve(config_json, {"learning_rate": 3e-6}, compiled)   # in `start` and `finish`
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, NamedTuple

from sparring.loop.config import PipelineConfig


class RunParameter(NamedTuple):
    """One run parameter: its type, the config field it sets, and what it means (the KFP UI
    shows the type and the description)."""

    type: type
    field: str  # dotted path in the config (`train.lr` is `verl.lr` with train_backend verl)
    help: str


RUN_PARAMETERS = {
    "model": RunParameter(
        str, "model", "Initial model (config `model`): a hub name, s3://… or models:/name@alias."
    ),
    "learning_rate": RunParameter(
        float, "train.lr", "GRPO learning rate (`train.lr`; `verl.lr` with train_backend verl)."
    ),
    "init_seed": RunParameter(
        int, "game_init.seed", "Seed of the initial game states (config `game_init.seed`)."
    ),
    "sampling_seed": RunParameter(
        int,
        "rollout.sampling.seed",
        "Rollout sampling seed, iteration i uses seed+i (`rollout.sampling.seed`; -1 = none).",
    ),
    "games_per_iteration": RunParameter(
        int, "games_per_iteration", "Self-play games per rollout (`games_per_iteration`)."
    ),
    "eval_games": RunParameter(
        int, "eval.num_games", "Held-out games per evaluation (`eval.num_games`; -1 = all val)."
    ),
    "experiment": RunParameter(
        str, "tracking.experiment", "MLflow experiment (config `tracking.experiment`)."
    ),
    "registered_model": RunParameter(
        str, "registered_model", "MLflow registered model name (config `registered_model`)."
    ),
}


# Int parameters whose field may be unset (None): -1 stands for it in the KFP UI.
UNSET_IS_MINUS_ONE = ("sampling_seed", "eval_games")


def _field(cfg: PipelineConfig, name: str) -> list[str]:
    path = RUN_PARAMETERS[name].field
    if path == "train.lr" and cfg.train_backend == "verl":
        path = "verl.lr"
    return path.split(".")


def values(cfg: PipelineConfig) -> dict[str, Any]:
    """The run parameters' values in `cfg` (an unset `train.lr` is GRPOConfig's default; an
    unset field of UNSET_IS_MINUS_ONE is -1)."""
    out = {}
    for name, param in RUN_PARAMETERS.items():
        node: Any = cfg.model_dump(mode="json")
        for key in _field(cfg, name):
            node = node.get(key) if isinstance(node, dict) else None
        if node is None:
            node = cfg.train.lr if name == "learning_rate" else -1
        out[name] = param.type(node)
    return out


def apply(cfg: PipelineConfig, params: dict[str, Any]) -> PipelineConfig:
    """`cfg` with the fields of `params` set (validated again as a whole)."""
    data = cfg.model_dump(mode="json")
    for name, value in params.items():
        if name not in RUN_PARAMETERS:
            raise ValueError(f"unknown run parameter {name!r}; known: {sorted(RUN_PARAMETERS)}")
        *parents, leaf = _field(cfg, name)
        node = data
        for key in parents:
            node = node[key]
        node[leaf] = None if name in UNSET_IS_MINUS_ONE and value == -1 else value
    return PipelineConfig.model_validate(data)


def shape(cfg: PipelineConfig) -> dict[str, Any]:
    """The graph-shaping fields: compiled into the pipeline, not changeable at run time."""
    return {
        "name": cfg.name,
        "iterations": cfg.iterations,
        "first_iteration": cfg.first_iteration,
        "warm_start": cfg.warm_start is not None,
        "evaluate_start": cfg.evaluate_start,
        "test": cfg.game_init.num_test > 0,
        "train_backend": cfg.train_backend,
        "verl.n_gpus_per_node": cfg.verl.n_gpus_per_node,
        "opponent_checkpoints": cfg.opponents.checkpoint_steps,
        "magnet_every": cfg.magnet_every,
        "kubernetes": cfg.kubernetes.model_dump(mode="json"),
    }


def fingerprint(cfg: PipelineConfig) -> str:
    """sha256 (16 hex digits) of `shape(cfg)`."""
    text = json.dumps(shape(cfg), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def compile_time(cfg: PipelineConfig) -> str:
    """What the IR embeds for `resolve`: the fingerprint, the shape and the parameters'
    defaults, as JSON."""
    return json.dumps(
        {"fingerprint": fingerprint(cfg), "shape": shape(cfg), "defaults": values(cfg)}
    )


def resolve(config: str, params: dict[str, Any], compiled: str) -> PipelineConfig:
    """The run's config: `config` (JSON) with the changed run `params` applied; see the module
    docstring. Raises ValueError naming the conflicting or compile-time fields."""
    embedded = json.loads(compiled)
    cfg = PipelineConfig.model_validate_json(config)
    if changed := _changed(embedded["shape"], shape(cfg)):
        raise ValueError(
            f"the `config` parameter changes compile-time fields {changed} (fingerprint "
            f"{fingerprint(cfg)}, compiled {embedded['fingerprint']}): they shape the pipeline "
            "graph, so compile and upload the pipeline again (`sparring compile` / "
            "`sparring submit`) instead of changing them at run time"
        )
    defaults, current = embedded["defaults"], values(cfg)
    changed_params = {}
    for name, value in params.items():
        value = RUN_PARAMETERS[name].type(value)  # KFP may hand ints over as floats
        if value == defaults[name]:
            continue  # left at its default: the config's field stands
        if current[name] not in (defaults[name], value):
            raise ValueError(
                f"run parameter {name}={value!r} conflicts with the `config` parameter, which "
                f"sets it to {current[name]!r} (compiled default {defaults[name]!r}): change "
                "one of them, not both"
            )
        changed_params[name] = value
    return apply(cfg, changed_params) if changed_params else cfg


def _changed(compiled: dict[str, Any], now: dict[str, Any], prefix: str = "") -> list[str]:
    """The fields of the compiled shape whose value differs in `now`. Fields the compiled shape
    lacks (a newer Sparring in the image added them, with defaults) do not count."""
    out = []
    for key, value in compiled.items():
        here = now.get(key)
        if isinstance(value, dict) and isinstance(here, dict):
            out += _changed(value, here, f"{prefix}{key}.")
        elif here != value:
            out.append(prefix + key)
    return out
