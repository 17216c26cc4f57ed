"""The opponent league's state across iterations (seed 001): the difficulty schedule carried
from one rollout to the next, and `past-<k>` opponents resolved to stored checkpoints.

    mix = opponent_mix(cfg, num_states, iteration, run_name, previous_schedule)
    past = past_models(cfg, run_name, iteration, model_dir, names, tmp)   # name -> (uri, dir)
    ...play with mix.plan...
    metrics = save_schedule(mix, states, iteration, episodes, out_dir, models)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NamedTuple

from sparring import storage
from sparring.loop.config import PipelineConfig
from sparring.loop.io import log, run_uri, upload
from sparring.opponents import DifficultySchedule, learner_rewards, past_steps, plan_seats


class OpponentMix(NamedTuple):
    """One rollout's opponent mix (see sparring.opponents)."""

    schedule: Any  # the DifficultySchedule it follows
    plan: list[list[str]]  # policy name per seat, per initial state
    rows: list[dict[str, Any]]  # one log row per initial state


def schedule_state(
    cfg: PipelineConfig, run_name: str, iteration: int, previous: str | Path | None
) -> dict[str, Any]:
    """The schedule state (`DifficultySchedule.to_dict`) a rollout continues (`carried`)."""
    return carried(cfg, run_name, iteration, previous, "schedule.json")


def carried(
    cfg: PipelineConfig, run_name: str, iteration: int, previous: str | Path | None, name: str
) -> dict[str, Any]:
    """A state the rollouts carry from one to the next in the JSON file `name`: the file
    `previous` (the pipeline passes the previous rollout's), or without one the file that
    rollout `iteration - 1` of this run stored (so a campaign block's first rollout continues
    the last block's); `{}` (a new state) when there is none. A retried rollout reads the same
    file again, so it never applies its own update twice."""
    if previous is not None:
        text = Path(previous).read_text() if Path(previous).exists() else None
    elif iteration > 0:
        uri = run_uri(cfg, run_name, iteration - 1, "rollout")
        text = storage.read_text(uri, name, cfg.storage.client_config())
    else:
        text = None
    return json.loads(text or "{}")


def opponent_mix(
    cfg: PipelineConfig,
    num_inits: int,
    iteration: int,
    run_name: str,
    previous: str | Path | None,
) -> OpponentMix:
    """Seat `num_inits` states by the schedule the last rollout left (or a new one)."""
    state = schedule_state(cfg, run_name, iteration, previous)
    new = DifficultySchedule(cfg.opponents.difficulty)
    schedule = DifficultySchedule.from_dict(state) if state else new
    roles = cfg.game.cls.roles
    fraction = cfg.opponents.selfplay_fraction
    return OpponentMix(schedule, *plan_seats(num_inits, roles, schedule, fraction, iteration))


def past_models(
    cfg: PipelineConfig,
    run_name: str,
    iteration: int,
    model_dir: str,
    names: list[str],
    tmp: str | Path,
) -> dict[str, tuple[str, str]]:
    """The `past-<k>` among `names`, each -> (stored URI, local folder) of its checkpoint.

    Rollout i's `past-<k>` is the policy that played rollout i-k: the checkpoint iteration
    i-k-1 trained, wherever `register` stored it (the registry knows: `stored_checkpoint`), or
    for i <= k the run's initial (or warm-started) model, which rollout 0 stores under
    `<run>/initial` whenever the pool names a `past-<k>`. Each URI is downloaded once, into
    `tmp`."""
    from sparring.registry import stored_checkpoint
    from sparring.tracking import connect

    initial = run_uri(cfg, run_name, "initial")
    if iteration == 0 and cfg.opponents.checkpoint_steps:
        upload(cfg, model_dir, initial)  # rollout i resolves past-<k> with k >= i to it
    steps = {name: k for name in names if (k := past_steps(name)) is not None}
    registry = cfg.tracking.enabled and any(iteration > k for k in steps.values())
    client = connect(cfg.tracking) if registry else None

    def stored(past: int) -> str:  # where `register` stored iteration `past`'s checkpoint
        if client is None:  # tracking off: always under the run's storage folder
            return run_uri(cfg, run_name, past, "checkpoint")
        return stored_checkpoint(cfg.registered_model, run_name, past, client)

    uris = {
        name: stored(iteration - k - 1) if iteration > k else initial for name, k in steps.items()
    }
    local: dict[str, str] = {}
    for uri in sorted(set(uris.values())):
        if iteration == 0:  # every past-<k> is the initial model: the learner's own
            local[uri] = model_dir
        else:
            folder = Path(tmp) / str(len(local))
            local[uri] = str(storage.download_dir(uri, folder, cfg.storage.client_config()))
    for name, uri in sorted(uris.items()):
        log(f"iteration {iteration}: opponent {name} = {uri}")
    return {name: (uri, local[uri]) for name, uri in uris.items()}


def save_schedule(
    mix: OpponentMix,
    inits: list[tuple[str, dict[str, Any]]],
    iteration: int,
    episodes: list[Any],
    out_dir: str | Path,
    models: dict[str, str],
) -> dict[str, float]:
    """Update the schedule with the learner's rewards; write `schedule.json` (its state and
    history) and `seat_plan.jsonl` (one row per initial state, with its `init_id` and
    `opponent_model`: the stored checkpoint a `past-<k>` opponent resolved to (`models`),
    else None) into `out_dir`; return its `difficulty/<role>` metrics."""
    mix.schedule.update(iteration, learner_rewards(episodes))
    out = Path(out_dir)
    (out / "schedule.json").write_text(json.dumps(mix.schedule.to_dict(), indent=1))
    with open(out / "seat_plan.jsonl", "w") as f:
        for row, (init_id, _) in zip(mix.rows, inits, strict=True):
            model = models.get(row["opponent"])
            line = {"iteration": iteration, "init_id": init_id, **row, "opponent_model": model}
            f.write(json.dumps(line) + "\n")
    return mix.schedule.metrics()
