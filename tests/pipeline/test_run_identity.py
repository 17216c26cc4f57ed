"""Run identity: storage keys on the KFP run id, or on the campaign id for a campaign's runs;
`run_name` is only a display name. Two campaigns of one pipeline, submitted through
`pipelines.driver.campaign` to a fake KFP client, never share a key, and `past-<k>` loads the
checkpoint of its own campaign."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import yaml
from sparring.pipelines.driver import campaign

from sparring.loop import league, tasks
from sparring.loop.config import PipelineConfig
from sparring.loop.io import run_uri, upload


class FakeKfp:
    """Takes uploads and runs; keeps the `config` each run's compiled pipeline embeds."""

    def __init__(self) -> None:
        self.versions: dict[str, str] = {}  # version id -> the package's `config` default
        self.runs: list[tuple[str, PipelineConfig]] = []  # (run display name, its config)

    def get_pipeline_id(self, name):
        return "p1" if self.versions else None

    def _keep(self, package) -> str:
        spec = next(yaml.safe_load_all(Path(package).read_text()))
        params = spec["root"]["inputDefinitions"]["parameters"]
        vid = f"v{len(self.versions)}"
        self.versions[vid] = params["config"]["defaultValue"]
        return vid

    def upload_pipeline(self, package, name):
        self._first = self._keep(package)
        return SimpleNamespace(pipeline_id="p1")

    def list_pipeline_versions(self, pipeline_id, filter=None):
        found = [] if filter else [SimpleNamespace(pipeline_version_id=self._first)]
        return SimpleNamespace(pipeline_versions=found)

    def upload_pipeline_version(self, package, name, pipeline_id):
        return SimpleNamespace(pipeline_version_id=self._keep(package))

    def create_experiment(self, name):
        return SimpleNamespace(experiment_id="e1")

    def run_pipeline(self, experiment_id, run_name, pipeline_id, version_id, service_account):
        cfg = PipelineConfig.model_validate_json(self.versions[version_id])
        self.runs.append((run_name, cfg))
        return SimpleNamespace(run_id=f"kfp-run-{len(self.runs)}")

    def wait_for_run_completion(self, run_id, timeout):
        return SimpleNamespace(state="SUCCEEDED")


def test_two_campaigns_never_share_storage_and_past_k_stays_in_its_campaign(tmp_path):
    cfg = PipelineConfig.model_validate(
        {
            "name": "nightly",
            "run_name": "same display name",
            "iterations": 1,
            "games_per_iteration": 4,
            "game_init": {"num_train": 4, "num_val": 1},
            "storage": {"root": str(tmp_path / "store")},
            "tracking": {"enabled": False},
        }
    )
    client = FakeKfp()
    for _ in range(2):  # two campaigns of one pipeline: 4 iterations in blocks of 2
        campaign(client, cfg, "sparring", total=4, block=2, timeout=1)

    # every run's `start` (the KFP run id is unique per run) gives its storage key
    keys = [tasks.start(c, f"kfp-run-{n}")[0] for n, (_, c) in enumerate(client.runs)]
    assert [c.first_iteration for _, c in client.runs] == [0, 2, 0, 2]
    assert keys[0] == keys[1] != keys[2] == keys[3]  # blocks share their campaign's key
    assert all(k.startswith("nightly-") and "display" not in k for k in keys)
    assert {c.run_name for _, c in client.runs} == {"same display name"}  # display only
    # outside a campaign a run keys on its own id, whatever its display name
    assert tasks.start(cfg, "kfp-run-a")[0] != tasks.start(cfg, "kfp-run-b")[0]

    # iteration 0 of each campaign stored a checkpoint of its own
    for key in (keys[0], keys[2]):
        (tmp_path / key).mkdir()
        (tmp_path / key / "weights.txt").write_text(key)
        upload(cfg, tmp_path / key, run_uri(cfg, key, 0, "checkpoint"))
    # the second block's first rollout (iteration 2) seats past-1: iteration 0's checkpoint
    for block in (1, 3):
        block_cfg, key = client.runs[block][1], keys[block]
        past = league.past_models(block_cfg, key, 2, "unused", ["past-1"], tmp_path / f"p{block}")
        uri, folder = past["past-1"]
        assert uri == run_uri(cfg, key, 0, "checkpoint")
        assert (Path(folder) / "weights.txt").read_text() == key


def test_two_runs_with_one_display_name_get_their_own_parent_and_storage(tmp_path, mlflow_db):
    """Two KFP runs shown as "nightly" (run ids differ): each `start` opens its own MLflow
    parent run, tagged with its run id and the display name, and stores its config under its
    own key; a retried `start` of the first finds its parent again."""
    from sparring.loop import runs
    from sparring.tracking import connect

    cfg = PipelineConfig.model_validate(
        {
            "name": "nightly",
            "iterations": 1,
            "games_per_iteration": 4,
            "game_init": {"num_train": 4, "num_val": 1},
            "storage": {"root": str(tmp_path / "store")},
            "tracking": {"tracking_uri": mlflow_db},
        }
    )
    first, second = (tasks.start(cfg, job, "nightly") for job in ("kfp-run-a", "kfp-run-b"))
    assert first[0] == "kfp-run-a" and second[0] == "kfp-run-b"  # storage keys
    assert first[1] != second[1]  # parent runs
    client = connect(cfg.tracking)
    for (key, parent), job in zip((first, second), ("kfp-run-a", "kfp-run-b"), strict=True):
        tags = client.get_run(parent).data.tags
        assert tags[runs.JOB_TAG] == job and tags["kfp.run_name"] == "nightly"
        assert (tmp_path / "store" / key / "config" / "config.yaml").exists()
    assert tasks.start(cfg, "kfp-run-a", "nightly") == first  # a retry reuses its parent
