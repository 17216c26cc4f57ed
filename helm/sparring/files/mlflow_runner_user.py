"""Create the pipeline runner's MLflow user and give it what pipeline tasks need, as the admin.

Runs in the chart's post-install/post-upgrade/post-rollback Job (image: the MLflow server
image; standard library only), against MLflow's basic-auth REST API (MLflow 3.x):

0. Wait until `$MLFLOW_TRACKING_URI/health` answers (a fresh install starts the server and the
   hook together).
1. The runner user `$RUNNER_USERNAME`: create it (`POST /api/2.0/mlflow/users/create`), or, if
   it exists, set its password to `$RUNNER_PASSWORD` (`PATCH .../users/update-password`), so a
   rotated Secret takes effect on `helm upgrade`. Refuse a runner that is an MLflow admin.
2. The pipeline's experiment `$MLFLOW_EXPERIMENT` and registered model `$REGISTERED_MODEL`:
   create them if missing, so the grants below have something to name.
3. Grant the runner EDIT on both (`POST /api/3.0/mlflow/users/permissions/grant`): create runs
   and logged models in the experiment, log to them, upload artifacts through the proxy,
   create model versions, set tags and aliases. Not MANAGE: no deletes, no grants. A grant the
   runner already holds at another level (MANAGE, when a task created the experiment itself)
   is replaced by EDIT.

The admin logs in with `$MLFLOW_TRACKING_USERNAME` / `$MLFLOW_TRACKING_PASSWORD`. Every step
is idempotent: a rerun with the user, experiment, model and grants in place changes nothing
but the (same) password. Exit status 0 on success; a message naming the fix otherwise.
"""

from __future__ import annotations

import base64
import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

# The runner's level on the experiment and the registered model: read, use and update (runs,
# logging, artifacts, model versions, tags, aliases); MANAGE would add deletes and grants.
PERMISSION = "EDIT"
USERS = "/api/2.0/mlflow/users"  # the basic-auth app's user API (admin only)
GRANTS = "/api/3.0/mlflow/users/permissions"  # its per-user grants (MLflow 3.x)


class MlflowError(RuntimeError):
    """An MLflow REST call failed; `code` is MLflow's error_code (or the HTTP status)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"HTTP {status} {code}: {message}")
        self.status, self.code = status, code


class Api:
    """MLflow's REST API at `url` (static prefix included), logged in as `user`."""

    def __init__(self, url: str, user: str, password: str) -> None:
        self.url = url.rstrip("/")
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        self.headers = {"Authorization": f"Basic {token}", "Content-Type": "application/json"}

    def call(self, method: str, path: str, body: dict | None = None, **params: str) -> Any:
        url = f"{self.url}{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(url, data, self.headers, method=method)
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                text = resp.read().decode()
        except urllib.error.HTTPError as e:
            text = e.read().decode(errors="replace")
            try:
                err = json.loads(text)
            except ValueError:
                err = {}
            code = err.get("error_code", str(e.code)) if isinstance(err, dict) else str(e.code)
            message = err.get("message", text) if isinstance(err, dict) else text
            raise MlflowError(e.code, code, message[:500]) from None
        return json.loads(text) if text.strip() else {}


def wait_for_health(url: str, timeout: float) -> None:
    """Step 0: poll `/health` (open without a login) until it answers 200."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"{url.rstrip('/')}/health", timeout=5) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"MLflow at {url} did not answer /health within {timeout:.0f} s")
        time.sleep(3)


def ensure_user(api: Api, username: str, password: str) -> str:
    """Step 1: the runner exists with this password and is not an admin."""
    try:
        user = api.call("GET", f"{USERS}/get", username=username)["user"]
    except MlflowError as e:
        if e.code != "RESOURCE_DOES_NOT_EXIST":
            raise
        api.call("POST", f"{USERS}/create", {"username": username, "password": password})
        return "created"
    if user.get("is_admin"):
        raise SystemExit(
            f"MLflow user {username!r} is an admin: the pipeline runner must not be. Pick "
            "another mlflow.auth.runner.username (or username in its existingSecret)."
        )
    api.call("PATCH", f"{USERS}/update-password", {"username": username, "password": password})
    return "exists, password set"


def ensure_experiment(api: Api, name: str) -> str:
    """Step 2: the experiment's id, creating it if missing."""
    try:
        got = api.call("GET", "/api/2.0/mlflow/experiments/get-by-name", experiment_name=name)
        return got["experiment"]["experiment_id"]
    except MlflowError as e:
        if e.code != "RESOURCE_DOES_NOT_EXIST":
            raise
    return api.call("POST", "/api/2.0/mlflow/experiments/create", {"name": name})["experiment_id"]


def ensure_registered_model(api: Api, name: str) -> None:
    """Step 2: the registered model exists."""
    try:
        api.call("POST", "/api/2.0/mlflow/registered-models/create", {"name": name})
    except MlflowError as e:
        if e.code != "RESOURCE_ALREADY_EXISTS":
            raise


def ensure_grant(api: Api, username: str, resource_type: str, resource_id: str) -> str:
    """Step 3: the runner's own grant on the resource is PERMISSION."""
    grant = {"username": username, "resource_type": resource_type, "resource_id": resource_id}
    try:
        api.call("POST", f"{GRANTS}/grant", {**grant, "permission": PERMISSION})
        return "granted"
    except MlflowError as e:
        if e.code != "RESOURCE_ALREADY_EXISTS":
            raise
    listed = api.call("GET", f"{GRANTS}/list", username=username)
    held = [  # grants on the user's own (synthetic `__user_<id>__`) role, not shared roles
        p["permission"]
        for p in listed.get("permissions", [])
        if (p.get("resource_type"), p.get("resource_pattern")) == (resource_type, resource_id)
        and str(p.get("role_name", "")).startswith("__user_")
    ]
    if held == [PERMISSION]:
        return "already held"
    api.call("POST", f"{GRANTS}/revoke", grant)
    api.call("POST", f"{GRANTS}/grant", {**grant, "permission": PERMISSION})
    return f"replaced {'/'.join(held) or 'another grant'}"


def main(env: dict[str, str]) -> None:
    url = env["MLFLOW_TRACKING_URI"]
    runner, password = env["RUNNER_USERNAME"], env["RUNNER_PASSWORD"]
    if runner == env["MLFLOW_TRACKING_USERNAME"]:
        raise SystemExit(
            f"the runner user {runner!r} is the MLflow admin: give the runner its own name "
            "(mlflow.auth.runner.username)"
        )
    wait_for_health(url, float(env.get("WAIT_SECONDS", "300")))
    api = Api(url, env["MLFLOW_TRACKING_USERNAME"], env["MLFLOW_TRACKING_PASSWORD"])
    print(f"user {runner}: {ensure_user(api, runner, password)}")
    experiment = env["MLFLOW_EXPERIMENT"]
    experiment_id = ensure_experiment(api, experiment)
    how = ensure_grant(api, runner, "experiment", experiment_id)
    print(f"experiment {experiment} ({experiment_id}): {PERMISSION} {how}")
    model = env["REGISTERED_MODEL"]
    ensure_registered_model(api, model)
    how = ensure_grant(api, runner, "registered_model", model)
    print(f"registered model {model}: {PERMISSION} {how}")


if __name__ == "__main__":
    try:
        main(dict(os.environ))
    except MlflowError as e:
        sys.exit(f"MLflow refused a call: {e}")
