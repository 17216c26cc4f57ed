"""Several models side by side on a game's policy metrics (`Game.policy_metrics`), from one
command.

    sparring compare --game diplomacy --param strategic.scenarios=8 --param press=false \\
        --model models:/sparring@champion --model models:/sparring/3 --model support \\
        --out runs/compare

A model is a scripted agent of the game (by name) or anything `sparring.models.resolve_model`
takes: a path, a named model, `s3://`, or a registered version or alias (`models:/<name>/<n>`,
`models:/<name>@<alias>`). Each model's metrics are named as in evaluation (`eval/<name>`).
Writes comparison.json ({label: metrics}) and the game's comparison report
(`Game.write_comparison`). With tracking, one MLflow run per model (`compare/<label>`, tagged
with its reference and, for a registered one, its version) holds its metrics and the report.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from sparring.games import GameSpec
from sparring.metrics import EVAL, prefixed
from sparring.rollout import play_games
from sparring.settings import TrackingConfig

MODEL_TAG = "sparring.compare.model"  # the reference a run's model was given as
VERSION_TAG = "sparring.compare.version"  # a registered model's version
METRICS_PER_CALL = 1000  # MLflow's log_batch limit


def label_of(ref: str) -> str:
    """A short, unique-enough name: `models:/x@champion` -> `x@champion`, a path -> its last
    two parts, an agent or a named model -> itself."""
    if ref.startswith("models:/"):
        return ref.removeprefix("models:/")
    return "/".join(Path(ref.rstrip("/")).parts[-2:]) if "/" in ref else ref


def compare(
    refs: list[str],
    game: GameSpec,
    temperature: float = 0.0,
    device: str = "auto",
    max_batch_size: int = 64,
) -> dict[str, dict[str, float]]:
    """{label: `eval/<name>` policy metrics} of each model in `refs`, one after another."""
    from sparring.generation.hf import HFBackend
    from sparring.models import resolve_model

    labels = [label_of(r) for r in refs]
    if len(set(labels)) != len(labels):
        raise ValueError(f"models {refs} share a label {labels}; name each model once")
    out = {}
    for ref, label in zip(refs, labels, strict=True):
        if ref in game.cls.agents:
            policy = game.make_agent(ref)
        else:
            policy = HFBackend(resolve_model(ref), device=device, max_batch_size=max_batch_size)
        metrics = game.make().policy_metrics(policy, temperature, play_games)
        if not metrics:
            raise ValueError(
                f"{game.name} reports no policy metrics with params {game.params}: set the "
                "game parameters that turn them on (docs/games.md)"
            )
        out[label] = prefixed(EVAL, metrics)
    return out


def write_comparison(
    by_model: dict[str, dict[str, float]], game: GameSpec, out_dir: str | Path
) -> dict[str, Path]:
    """comparison.json and the game's comparison report files."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "comparison.json").write_text(json.dumps(by_model, indent=1, sort_keys=True))
    return {"comparison": out / "comparison.json"} | game.cls.write_comparison(by_model, out)


def log_comparison(
    by_model: dict[str, dict[str, float]],
    refs: list[str],
    game: GameSpec,
    files: dict[str, Path],
    tracking: TrackingConfig,
) -> dict[str, str]:
    """One finished MLflow run per model (see the module docstring); {label: run id}."""
    from mlflow.entities import Metric

    from sparring.tracking import PipelineRun

    runs = {}
    for ref, (label, metrics) in zip(refs, by_model.items(), strict=True):
        tags = {MODEL_TAG: ref} | _version_tag(ref, tracking)
        params = {"model": ref, "game": game.model_dump()}
        with PipelineRun.start(tracking, f"compare/{label}", params, tags) as run:
            now = int(time.time() * 1000)
            batch = [Metric(k, float(v), now, 0) for k, v in sorted(metrics.items())]
            for i in range(0, len(batch), METRICS_PER_CALL):
                run.client.log_batch(run.run_id, metrics=batch[i : i + METRICS_PER_CALL])
            for path in files.values():
                run.log_artifact(path, dest="compare")
        runs[label] = run.run_id
    return runs


def _version_tag(ref: str, tracking: TrackingConfig) -> dict[str, str]:
    """{VERSION_TAG: version} of a registered model reference; {} for others."""
    if not ref.startswith("models:/"):
        return {}
    from sparring.tracking import connect

    client = connect(tracking)
    name, _, rest = ref.removeprefix("models:/").partition("@")
    if rest:  # an alias
        return {VERSION_TAG: str(client.get_model_version_by_alias(name, rest).version)}
    return {VERSION_TAG: ref.rpartition("/")[2]}
