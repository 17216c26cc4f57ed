"""Compile the Sparring pipeline from the chart's config and register it with the KFP API.

Runs in the chart's post-install/post-upgrade/post-rollback Job (image: the Sparring CPU
image):

0. Ask the KFP API which backend it is (`GET /apis/v2beta1/healthz`: `tag_name`, `multi_user`)
   and fail early, naming the fix, when it is older than `$KFP_MIN_VERSION` or its mode is not
   `$KFP_MULTI_USER`.
1. `sparring compile --config $PIPELINE_CONFIG --kfp-version <2.16|2.17> -o $PIPELINE_PACKAGE`
   turns the rendered config into pipeline IR (same command, same config as a user's laptop),
   for the backend step 0 found: 2.17 on a 2.17 or later backend (which then gets the run
   deadline), else 2.16 (whose API server would drop a 2.17 platform spec).
2. Upload it as a version of pipeline `$PIPELINE_NAME` named by its content,
   `$PIPELINE_VERSION_PREFIX-<sha256 of the compiled pipeline, 12 hex>`, unless that version
   exists (multi-user KFP: a pipeline of the profile namespace `$KFP_NAMESPACE`). A reinstall
   never reuses a stale version, and a rollback finds the version it compiles again.
3. If `$RECURRING_RUN_CRON` is set, point the recurring run `$RECURRING_RUN_NAME` (in
   experiment `$RECURRING_RUN_EXPERIMENT`) at that version, replacing the old one; if only
   `$RECURRING_RUN_NAME` is set (an upgrade turned it off), disable it.

`register_pipeline.py disable` is the pre-delete hook: it disables the recurring run, so it
stops firing after `helm uninstall` (its runs' history stays in KFP). Every step is idempotent,
so a retried Job converges to the same state.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

TOKEN_PATH = "/var/run/secrets/kubeflow/pipelines/token"  # projected SA token (multi-user KFP)


def parse_version(tag: str) -> tuple[int, int, int] | None:
    """(major, minor, patch) of a KFP tag such as `2.17.0` or `v2.14.3-rc.1`; None if not one."""
    m = re.match(r"^v?(\d+)\.(\d+)\.(\d+)", tag.strip())
    return tuple(int(x) for x in m.groups()) if m else None


def check_backend(healthz: Mapping[str, Any], min_version: str, multi_user: bool) -> str:
    """Step 0: the KFP backend is new enough and in the expected mode; returns its version.
    Raises SystemExit with the fix otherwise. A build that reports no version (`unknown`,
    a dev build) passes with a warning."""
    tag = str(healthz.get("tag_name", "unknown"))
    have, need = parse_version(tag), parse_version(min_version)
    if have is None:
        print(f"warning: KFP reports version {tag!r}; cannot check it is >= {min_version}")
    elif need and have < need:
        raise SystemExit(
            f"KFP {tag} is too old for this install: it needs {min_version} or later (2.14 for "
            "the exit handler's final status; 2.17 for a non-AWS S3 endpoint or IRSA in the "
            "launcher). Upgrade Kubeflow Pipelines, or set kfp.minVersion if you know better."
        )
    reported = bool(healthz.get("multi_user", False))
    if reported != multi_user:
        mode = "multi-user" if reported else "standalone (single-user)"
        raise SystemExit(
            f"KFP at this host is {mode} but the chart has kfp.multiUser={str(multi_user).lower()}"
            f": set kfp.multiUser={str(reported).lower()} (and install into the profile namespace"
            " for multi-user)."
        )
    return tag


def get_healthz(host: str, token: str | None = None, timeout: float = 10.0) -> dict:
    """GET <host>/apis/v2beta1/healthz (the JSON the API server writes itself)."""
    req = urllib.request.Request(f"{host.rstrip('/')}/apis/v2beta1/healthz")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read().decode())


def read_token() -> str | None:
    return Path(TOKEN_PATH).read_text().strip() if Path(TOKEN_PATH).exists() else None


def compile_target(version: str) -> str:
    """The KFP release to compile for on a backend reporting `version`: 2.17 from 2.17 on,
    else 2.16 (also for a build that reports no version)."""
    have = parse_version(version)
    return "2.17" if have is not None and have >= (2, 17, 0) else "2.16"


def compile_pipeline(config: str, package: str, kfp_version: str) -> None:
    """Step 1: `sparring compile`, the same entry point users run."""
    command = ["sparring", "compile", "--config", config, "--kfp-version", kfp_version]
    subprocess.run([*command, "-o", package], check=True)


def version_name(prefix: str, package: str) -> str:
    """`<prefix>-<sha256 of the compiled package, 12 hex>`: the same pipeline is the same
    version, a changed one a new version."""
    return f"{prefix}-{hashlib.sha256(Path(package).read_bytes()).hexdigest()[:12]}"


def _find_version(client: Any, pipeline_id: str, name: str) -> str | None:
    """The id of the version called `name` of pipeline `pipeline_id`, or None."""
    flt = json.dumps(
        {"predicates": [{"key": "display_name", "operation": "EQUALS", "string_value": name}]}
    )
    versions = client.list_pipeline_versions(pipeline_id, page_size=1, filter=flt)
    found = versions.pipeline_versions or []
    return found[0].pipeline_version_id if found else None


def find_pipeline(client: Any, name: str, namespace: str | None) -> str | None:
    """The id of pipeline `name`: a shared one, or (multi-user) one of `namespace`."""
    if namespace is None:
        return client.get_pipeline_id(name)
    flt = json.dumps(
        {"predicates": [{"key": "display_name", "operation": "EQUALS", "string_value": name}]}
    )
    found = client.list_pipelines(page_size=2, filter=flt, namespace=namespace).pipelines or []
    return found[0].pipeline_id if found else None


def upload(
    client: Any,
    package: str,
    name: str,
    version: str,
    description: str,
    namespace: str | None = None,
) -> tuple[str, str]:
    """Step 2: create the pipeline (in `namespace` for multi-user KFP) if needed, and add
    `version` to it unless it has it. Returns (pipeline_id, version_id)."""
    pipeline_id = find_pipeline(client, name, namespace)
    if pipeline_id is None:  # its first version is named after the pipeline; ours follows
        pipeline = client.upload_pipeline(
            package, pipeline_name=name, description=description, namespace=namespace
        )
        pipeline_id = pipeline.pipeline_id
        print(f"created pipeline {name!r} ({pipeline_id})")
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
    for old in find_recurring(client, experiment, job_name, namespace):
        client.delete_recurring_run(old)
        print(f"replaced recurring run {job_name!r} ({old})")
    exp = client.create_experiment(experiment, namespace=namespace)  # returns it if it exists
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


def find_recurring(client: Any, experiment: str, job_name: str, namespace: str | None) -> list:
    """The ids of the recurring runs called `job_name` in `experiment` (none if it is missing)."""
    try:
        exp = client.get_experiment(experiment_name=experiment, namespace=namespace)
    except ValueError:  # kfp.Client: "No experiment is found with name ..."
        return []
    found = client.list_recurring_runs(experiment_id=exp.experiment_id, page_size=100)
    return [r.recurring_run_id for r in found.recurring_runs or [] if r.display_name == job_name]


def disable(client: Any, experiment: str, job_name: str, namespace: str | None) -> list:
    """The pre-delete hook (and an upgrade that turns it off): disable the recurring run
    `job_name`, so it stops firing. Returns the ids disabled."""
    found = find_recurring(client, experiment, job_name, namespace)
    for rid in found:
        client.disable_recurring_run(rid)
        print(f"disabled recurring run {job_name!r} ({rid})")
    return found


def make_client(env: Mapping[str, str]) -> Any:
    """A kfp.Client for $KFP_HOST, with the projected SA token when one is mounted."""
    import kfp

    return kfp.Client(
        host=env["KFP_HOST"],
        existing_token=read_token(),
        namespace=env.get("KFP_NAMESPACE") or "kubeflow",
    )


def main(
    env: Mapping[str, str] = os.environ, client: Any = None, healthz=None, action: str = "register"
) -> int:
    """`register` (steps 0-3) or `disable` (the pre-delete hook)."""
    multi_user = env.get("KFP_MULTI_USER", "false") == "true"
    if action == "disable":
        client = client or make_client(env)
        namespace = env.get("KFP_NAMESPACE") or None
        disable(client, env["RECURRING_RUN_EXPERIMENT"], env["RECURRING_RUN_NAME"], namespace)
        return 0
    health = healthz if healthz is not None else get_healthz(env["KFP_HOST"], read_token())
    version = check_backend(health, env.get("KFP_MIN_VERSION", "2.14.0"), multi_user)
    print(f"KFP {version}, {'multi-user' if multi_user else 'standalone'}")
    package = env.get("PIPELINE_PACKAGE", "/tmp/pipeline.yaml")
    compile_pipeline(env["PIPELINE_CONFIG"], package, compile_target(version))
    client = client or make_client(env)
    pipeline_id, version_id = upload(
        client,
        package,
        env["PIPELINE_NAME"],
        version_name(env["PIPELINE_VERSION_PREFIX"], package),
        env.get("DESCRIPTION", ""),
        namespace=env.get("KFP_NAMESPACE") if multi_user else None,
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
    elif env.get("RECURRING_RUN_NAME"):
        namespace = env.get("KFP_NAMESPACE") or None
        disable(client, env["RECURRING_RUN_EXPERIMENT"], env["RECURRING_RUN_NAME"], namespace)
    return 0


if __name__ == "__main__":
    sys.exit(main(action=sys.argv[1] if len(sys.argv) > 1 else "register"))
