"""Compile the Sparring pipeline from the chart's config and register it with the KFP API.

Runs in the chart's post-install/post-upgrade Job (image: the Sparring CPU image):

1. `sparring compile --config $PIPELINE_CONFIG -o $PIPELINE_PACKAGE` turns the rendered config
   into pipeline IR (same command, same config as a user's laptop).
2. Upload it as pipeline `$PIPELINE_NAME`, or as a new version `$PIPELINE_VERSION` of it.
3. If `$RECURRING_RUN_CRON` is set, point the recurring run `$RECURRING_RUN_NAME` (in
   experiment `$RECURRING_RUN_EXPERIMENT`) at the new version, replacing the old one.

Every step is idempotent, so a retried Job converges to the same state.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

TOKEN_PATH = "/var/run/secrets/kubeflow/pipelines/token"  # projected SA token (multi-user KFP)


def compile_pipeline(config: str, package: str) -> None:
    """Step 1: `sparring compile`, the same entry point users run."""
    subprocess.run(["sparring", "compile", "--config", config, "-o", package], check=True)


def _find_version(client: Any, pipeline_id: str, name: str) -> str | None:
    """The id of the version called `name` of pipeline `pipeline_id`, or None."""
    flt = json.dumps(
        {"predicates": [{"key": "display_name", "operation": "EQUALS", "string_value": name}]}
    )
    versions = client.list_pipeline_versions(pipeline_id, page_size=1, filter=flt)
    found = versions.pipeline_versions or []
    return found[0].pipeline_version_id if found else None


def upload(client: Any, package: str, name: str, version: str, description: str) -> tuple[str, str]:
    """Step 2: create the pipeline or add `version` to it. Returns (pipeline_id, version_id)."""
    pipeline_id = client.get_pipeline_id(name)
    if pipeline_id is None:
        pipeline = client.upload_pipeline(package, pipeline_name=name, description=description)
        pipeline_id = pipeline.pipeline_id
        first = client.list_pipeline_versions(pipeline_id, page_size=1).pipeline_versions
        print(f"created pipeline {name!r} ({pipeline_id})")
        return pipeline_id, first[0].pipeline_version_id
    version_id = _find_version(client, pipeline_id, version)
    if version_id is None:
        created = client.upload_pipeline_version(
            package, pipeline_version_name=version, pipeline_id=pipeline_id, description=description
        )
        version_id = created.pipeline_version_id
        print(f"uploaded version {version!r} of pipeline {name!r} ({version_id})")
    else:
        print(f"version {version!r} of pipeline {name!r} already exists ({version_id})")
    return pipeline_id, version_id


def schedule(
    client: Any,
    pipeline_id: str,
    version_id: str,
    *,
    experiment: str,
    job_name: str,
    cron: str,
    max_concurrency: int,
    params: Mapping[str, Any],
    service_account: str | None,
    namespace: str | None,
) -> str:
    """Step 3: one recurring run called `job_name`, on the given version. Returns its id."""
    exp = client.create_experiment(experiment, namespace=namespace)  # returns it if it exists
    existing = client.list_recurring_runs(experiment_id=exp.experiment_id, page_size=100)
    for old in existing.recurring_runs or []:
        if old.display_name == job_name:
            client.delete_recurring_run(old.recurring_run_id)
            print(f"replaced recurring run {job_name!r} ({old.recurring_run_id})")
    run = client.create_recurring_run(
        exp.experiment_id,
        job_name,
        cron_expression=cron,
        max_concurrency=max_concurrency,
        no_catchup=True,
        params=dict(params),
        pipeline_id=pipeline_id,
        version_id=version_id,
        service_account=service_account,
    )
    print(f"recurring run {job_name!r} ({run.recurring_run_id}) on cron {cron!r}")
    return run.recurring_run_id


def make_client(env: Mapping[str, str]) -> Any:
    """A kfp.Client for $KFP_HOST, with the projected SA token when one is mounted."""
    import kfp

    token = Path(TOKEN_PATH).read_text().strip() if Path(TOKEN_PATH).exists() else None
    return kfp.Client(
        host=env["KFP_HOST"], existing_token=token, namespace=env.get("KFP_NAMESPACE") or "kubeflow"
    )


def main(env: Mapping[str, str] = os.environ, client: Any = None) -> int:
    package = env.get("PIPELINE_PACKAGE", "/tmp/pipeline.yaml")
    compile_pipeline(env["PIPELINE_CONFIG"], package)
    client = client or make_client(env)
    pipeline_id, version_id = upload(
        client, package, env["PIPELINE_NAME"], env["PIPELINE_VERSION"], env.get("DESCRIPTION", "")
    )
    if env.get("RECURRING_RUN_CRON"):
        schedule(
            client,
            pipeline_id,
            version_id,
            experiment=env["RECURRING_RUN_EXPERIMENT"],
            job_name=env["RECURRING_RUN_NAME"],
            cron=env["RECURRING_RUN_CRON"],
            max_concurrency=int(env.get("RECURRING_RUN_MAX_CONCURRENCY", "1")),
            params=json.loads(env.get("RECURRING_RUN_PARAMS") or "{}"),
            service_account=env.get("RECURRING_RUN_SERVICE_ACCOUNT") or None,
            namespace=env.get("KFP_NAMESPACE") or None,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
