"""The Helm chart, offline: lint, render with realistic values files, validate every manifest
with kubernetes-validate (strict), invalid combinations, the pipeline config, and the chart's
scripts (registration against a fake KFP client, the dev S3 server against a real `weed`).

There is no helm binary, API server or cluster here: helm-python-sdk renders the chart.
"""

from __future__ import annotations

import copy
import http.server
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import jsonschema
import kubernetes_validate
import pytest
import yaml
from helm_python import Chart, lint

import sparring

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "helm" / "sparring"
KUBE_VERSION = "1.30.0"
RELEASE, NAMESPACE = "sparring", "kubeflow"

# Minimal values a plain `helm install --set ...` needs.
MINIMAL = {
    "s3": {"bucket": "sparring-min", "credentials": {"accessKeyId": "a", "secretAccessKey": "s"}}
}
VALUES_FILES = {
    "minimal": None,
    "local": CHART / "values-local.yaml",
    "gpu": CHART / "values-gpu.yaml",
    "irsa": CHART / "ci" / "irsa-values.yaml",
    "external": CHART / "ci" / "external-s3-postgres-values.yaml",
    "multi-user": CHART / "ci" / "multi-user-values.yaml",
}
# Where each values file is installed: multi-user KFP runs in the profile namespace.
NAMESPACES = {"multi-user": "team-a"}


def values_for(name: str) -> dict:
    path = VALUES_FILES[name]
    return MINIMAL if path is None else yaml.safe_load(path.read_text())


def load_module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def chart() -> Chart:
    return Chart.load(str(CHART))


def render(chart: Chart, values: dict, revision: int = 1, namespace: str = NAMESPACE) -> list[dict]:
    """Every manifest the chart renders (hooks and tests included), parsed."""
    out = chart.render(values, name=RELEASE, namespace=namespace, revision=revision)
    docs = []
    for path, text in out.items():
        if path.endswith("NOTES.txt"):
            continue
        docs += [d for d in yaml.safe_load_all(text) if d]
    return docs


def by_kind(docs: list[dict], kind: str) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def pod_specs(docs: list[dict]) -> list[dict]:
    specs = []
    for d in docs:
        if d["kind"] in ("Deployment", "Job"):
            specs.append(d["spec"]["template"]["spec"])
        elif d["kind"] == "Pod":
            specs.append(d["spec"])
    return specs


def build_sh_refs(*args: str) -> list[str]:
    out = subprocess.run(
        ["bash", str(ROOT / "images" / "build.sh"), "--print", *args],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.split()


def launcher_patch(chart: Chart, values: dict, namespace: str = NAMESPACE) -> dict:
    """The `data` of the `kubectl patch configmap kfp-launcher` command NOTES.txt prints."""
    notes = chart.render(values, name=RELEASE, namespace=namespace)["sparring/templates/NOTES.txt"]
    (line,) = [ln for ln in notes.splitlines() if "patch configmap kfp-launcher" in ln]
    assert f"kubectl -n {namespace} patch configmap kfp-launcher --type merge -p '" in line
    return json.loads(line.split(" -p '", 1)[1].rstrip("'"))["data"]


def pipeline_config_text(docs: list[dict]) -> str:
    return by_kind(docs, "ConfigMap")[f"{RELEASE}-pipeline"]["data"]["pipeline.yaml"]


def pipeline_config(docs: list[dict]) -> dict:
    return yaml.safe_load(pipeline_config_text(docs))


# ---- lint, schema, validation --------------------------------------------------------------


def test_chart_metadata_tracks_project_version():
    meta = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert meta["appVersion"] == sparring.__version__
    assert meta["apiVersion"] == "v2"


def render_named(chart: Chart, name: str, revision: int = 1) -> list[dict]:
    return render(chart, values_for(name), revision, NAMESPACES.get(name, NAMESPACE))


# Gateway API kinds are CRDs kubernetes-validate has no schema for; tests check them by hand.
CRD_KINDS = {"HTTPRoute"}
# Istio's own CRD schemas (security.istio.io/v1, Istio 1.29.1 as Kubeflow's manifests ship it).
ISTIO_SCHEMAS = json.loads((ROOT / "tests" / "istio-1.29.1-security.schema.json").read_text())


def strict_schema(schema: dict) -> dict:
    """A CRD's openAPIV3Schema as the API server reads it with strict field validation
    (`kubectl apply --validate=strict`): an object with `properties` takes no other field
    (unless the CRD preserves unknown fields there)."""
    if isinstance(schema, list):
        return [strict_schema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: strict_schema(v) for k, v in schema.items()}
    keeps_unknown = schema.get("x-kubernetes-preserve-unknown-fields")
    if "properties" in schema and "additionalProperties" not in schema and not keeps_unknown:
        out["additionalProperties"] = False
    return out


def validate_crd(doc: dict, schema: dict) -> None:
    """Validate a custom resource against its CRD's schema, strictly; every CRD has the
    apiVersion, kind and metadata of any object, which its schema need not list."""
    body = {k: v for k, v in doc.items() if k not in ("apiVersion", "kind", "metadata")}
    jsonschema.validate(
        body,
        strict_schema(
            {
                **schema,
                "properties": {
                    k: v
                    for k, v in schema["properties"].items()
                    if k not in ("apiVersion", "kind", "metadata")
                },
            }
        ),
    )


def validate_strict(docs: list[dict]) -> None:
    for doc in docs:
        if doc["kind"] in ISTIO_SCHEMAS:
            assert doc["apiVersion"] == "security.istio.io/v1"
            validate_crd(doc, ISTIO_SCHEMAS[doc["kind"]])
        elif doc["kind"] not in CRD_KINDS:
            # raises ValidationError on unknown fields (strict) or wrong types
            kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)


def restricted_violations(spec: dict) -> list[str]:
    """What keeps a pod spec from the `restricted` Pod Security Standard (Kubernetes 1.30's
    checks, https://kubernetes.io/docs/concepts/security/pod-security-standards/)."""
    pod_sc = spec.get("securityContext", {})
    bad = [f"{k}" for k in ("hostNetwork", "hostPID", "hostIPC") if spec.get(k)]
    bad += [v["name"] for v in spec.get("volumes", []) if "hostPath" in v]
    pod_seccomp = pod_sc.get("seccompProfile", {}).get("type")
    for c in spec.get("initContainers", []) + spec["containers"]:
        sc = c.get("securityContext", {})
        if sc.get("privileged") or sc.get("allowPrivilegeEscalation") is not False:
            bad.append(f"{c['name']}: allowPrivilegeEscalation must be false")
        if "ALL" not in sc.get("capabilities", {}).get("drop", []):
            bad.append(f"{c['name']}: capabilities must drop ALL")
        if set(sc.get("capabilities", {}).get("add", [])) - {"NET_BIND_SERVICE"}:
            bad.append(f"{c['name']}: adds capabilities")
        if not sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")):
            bad.append(f"{c['name']}: runAsNonRoot must be true")
        if sc.get("runAsUser", pod_sc.get("runAsUser")) == 0:
            bad.append(f"{c['name']}: runAsUser 0")
        seccomp = sc.get("seccompProfile", {}).get("type", pod_seccomp)
        if seccomp not in ("RuntimeDefault", "Localhost"):
            bad.append(f"{c['name']}: seccompProfile must be RuntimeDefault or Localhost")
    return bad


@pytest.mark.parametrize("name", list(VALUES_FILES))
def test_lint_passes(name):
    report = lint(
        str(CHART),
        values_for(name),
        strict=True,
        kube_version=f"v{KUBE_VERSION}",
        namespace=NAMESPACES.get(name, NAMESPACE),
    )
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


@pytest.mark.parametrize("name", list(VALUES_FILES))
def test_manifests_are_valid_kubernetes(chart, name):
    docs = render_named(chart, name)
    assert len(docs) >= 8
    validate_strict(docs)


@pytest.mark.parametrize("name", list(VALUES_FILES))
def test_every_pod_is_hardened_and_uses_our_images(chart, name):
    values = values_for(name)
    docs = render_named(chart, name)
    repo = values.get("image", {}).get("repository", "ghcr.io/sparring/sparring")
    cpu_ref = build_sh_refs("--repository", repo, "--only", "cpu")[0]
    mlflow_ref = build_sh_refs("--repository", repo, "--only", "mlflow")[0]
    specs = pod_specs(docs)
    assert specs
    for spec in specs:
        # the MLflow server and its schema migrations run from the slim MLflow image
        mlflow_pod = any(
            c["command"][:3] == ["mlflow", "db", "upgrade"] or c["command"] == ["mlflow"]
            for c in spec["containers"] + spec.get("initContainers", [])
        )
        assert restricted_violations(spec) == []
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["runAsUser"] != 0
        for c in spec["containers"]:
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False
            assert sc["readOnlyRootFilesystem"] is True
            assert sc["capabilities"]["drop"] == ["ALL"]
            assert c["resources"]["requests"] and c["resources"]["limits"]["memory"]
            assert c["image"] == (mlflow_ref if mlflow_pod else cpu_ref)
            # a read-only root needs a writable /tmp
            assert "/tmp" in {m["mountPath"] for m in c["volumeMounts"]}
        # the runner's token is mounted only where the API is called with it (helm test)
        assert spec["automountServiceAccountToken"] is (
            spec["containers"][0]["name"] == "smoke-test"
        )


def test_default_install_pieces(chart):
    docs = render(chart, MINIMAL)
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == sorted(
        ["ServiceAccount", "Role", "RoleBinding", "Secret", "ConfigMap", "NetworkPolicy"]
        + ["NetworkPolicy"]  # networkPolicy.ray: the RayJobs' pods
        + ["Deployment", "Service", "PersistentVolumeClaim", "Job", "Job", "Pod"]
        + ["Role", "RoleBinding"]  # rbac.rayJobs: the verl task's RayJob calls
    )
    mlflow = by_kind(docs, "Deployment")[f"{RELEASE}-mlflow"]
    args = mlflow["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--artifacts-destination=s3://sparring-min/sparring/mlflow" in args
    assert any(a.startswith("--allowed-hosts=sparring-mlflow,") for a in args)
    probe = mlflow["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]
    assert probe["path"] == "/health"
    job = by_kind(docs, "Job")[f"{RELEASE}-register-r1"]
    assert (
        job["metadata"]["annotations"]["helm.sh/hook"] == "post-install,post-upgrade,post-rollback"
    )
    disable = by_kind(docs, "Job")[f"{RELEASE}-disable-r1"]
    assert disable["metadata"]["annotations"]["helm.sh/hook"] == "pre-delete"
    test_pod = by_kind(docs, "Pod")[f"{RELEASE}-test"]
    assert test_pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    # KFP owns kfp-launcher: the default install never creates (or later deletes) it
    assert "kfp-launcher" not in by_kind(docs, "ConfigMap")


def test_irsa_has_no_keys_and_annotates_the_service_account(chart):
    docs = render(chart, values_for("irsa"))
    assert "Secret" not in {d["kind"] for d in docs}
    sa = by_kind(docs, "ServiceAccount")[RELEASE]
    assert sa["metadata"]["annotations"]["eks.amazonaws.com/role-arn"].startswith("arn:aws:iam::")
    providers = yaml.safe_load(launcher_patch(chart, values_for("irsa"))["providers"])
    assert providers["s3"]["default"]["credentials"] == {"fromEnv": True}
    env = by_kind(docs, "Deployment")[f"{RELEASE}-mlflow"]["spec"]["template"]["spec"][
        "containers"
    ][0]["env"]
    assert "AWS_ACCESS_KEY_ID" not in {e["name"] for e in env}
    assert pipeline_config(docs)["kubernetes"]["s3_secret"] is None


def test_local_values_bundle_seaweedfs_as_the_endpoint(chart):
    docs = render(chart, values_for("local"))
    assert f"{RELEASE}-s3" in by_kind(docs, "Deployment")
    assert f"{RELEASE}-s3" in by_kind(docs, "PersistentVolumeClaim")
    endpoint = f"http://{RELEASE}-s3.{NAMESPACE}.svc.cluster.local:8333"
    providers = yaml.safe_load(launcher_patch(chart, values_for("local"))["providers"])
    assert (
        providers["s3"]["default"]["endpoint"] == f"{RELEASE}-s3.{NAMESPACE}.svc.cluster.local:8333"
    )
    assert providers["s3"]["default"]["disableSSL"] is True
    assert providers["s3"]["default"]["forcePathStyle"] is True
    cfg = pipeline_config(docs)
    assert cfg["storage"]["endpoint_url"] == endpoint
    k8s = cfg["kubernetes"]
    assert (k8s["rollout_gpus"], k8s["train_gpus"], k8s["eval_gpus"]) == (0, 0, 0)
    assert cfg["model"] == "tiny" and cfg["device"] == "cpu"


def test_external_values_use_postgres_pull_secrets_ingress_and_hf(chart):
    docs = render(chart, values_for("external"))
    mlflow = by_kind(docs, "Deployment")[f"{RELEASE}-mlflow"]["spec"]["template"]["spec"]
    db = next(e for e in mlflow["containers"][0]["env"] if e["name"] == "MLFLOW_BACKEND_STORE_URI")
    assert db["valueFrom"]["secretKeyRef"] == {"name": "mlflow-postgres", "key": "uri"}
    assert mlflow["imagePullSecrets"] == [{"name": "regcred"}]
    job = by_kind(docs, "Job")[f"{RELEASE}-register-r1"]["spec"]["template"]["spec"]
    assert job["containers"][0]["image"] == "registry.example.com/ml/sparring:0.1.0-cpu"
    assert "kfp-token" not in {v["name"] for v in job["volumes"]}  # standalone KFP: no token


# ---- invalid values ------------------------------------------------------------------------

AUTH_ON = {"enabled": True, "adminPassword": "pw-for-the-chart-test"}
BAD_COMBINATIONS = [
    ({"s3": {"bucket": ""}}, "s3.bucket is required"),
    ({"s3": {"bucket": "sparring-x"}}, "mode=secret needs s3.credentials.accessKeyId"),
    (
        {"s3": {"bucket": "sparring-x", "credentials": {"mode": "existingSecret"}}},
        "needs s3.credentials.existingSecret",
    ),
    (
        {"s3": {"bucket": "sparring-x", "credentials": {"mode": "serviceAccount"}}},
        "needs serviceAccount.annotations",
    ),
    (
        {
            "s3": {
                "bucket": "sparring-x",
                "credentials": {"mode": "existingSecret", "existingSecret": "s"},
            },
            "seaweedfs": {"enabled": True},
        },
        "seaweedfs.enabled needs s3.credentials.mode=secret",
    ),
    ({**MINIMAL, "mlflow": {"replicas": 2}}, "supports one replica"),
    (
        {**MINIMAL, "mlflow": {"backendStore": {"type": "postgres"}}},
        "needs mlflow.backendStore.postgres.existingSecret",
    ),
    ({**MINIMAL, "mlflow": {"enabled": False}}, "needs mlflow.externalUrl"),
    (
        {**MINIMAL, "mlflow": {"auth": {"enabled": True, "adminPassword": "too-short"}}},
        "needs mlflow.auth.adminPassword",
    ),
    (
        {
            **MINIMAL,
            "mlflow": {
                "auth": {"enabled": True, "existingSecret": "login"},
                "backendStore": {"type": "postgres", "postgres": {"existingSecret": "db"}},
            },
        },
        "mlflow.auth.enabled keeps MLflow's users in a sqlite file",
    ),
    (
        {
            **MINIMAL,
            "pipeline": {"register": {"enabled": False, "recurringRun": {"enabled": True}}},
        },
        "needs pipeline.register.enabled",
    ),
    (
        {**MINIMAL, "mlflow": {"auth": {**AUTH_ON, "runner": {"username": "admin"}}}},
        "mlflow.auth.runner.username must differ from mlflow.auth.adminUsername",
    ),
    (
        {**MINIMAL, "mlflow": {"auth": {**AUTH_ON, "runner": {"password": "too-short"}}}},
        "mlflow.auth.runner.password needs at least 12 characters",
    ),
    (
        {
            **MINIMAL,
            "mlflow": {
                "auth": {**AUTH_ON, "runner": {"password": "x" * 12, "existingSecret": "r"}}
            },
        },
        "mlflow.auth.runner.password and mlflow.auth.runner.existingSecret are exclusive",
    ),
]


@pytest.mark.parametrize(("values", "message"), BAD_COMBINATIONS)
def test_invalid_combinations_fail_with_the_fix(chart, values, message):
    with pytest.raises(Exception, match=message.replace(".", r"\.")):
        chart.render(values, name=RELEASE, namespace=NAMESPACE)


BAD_SCHEMA = [
    (
        {**MINIMAL, "pipeline": {"gpu": {"train": "two"}}},
        "/pipeline/gpu/train': got string, want integer",
    ),
    ({"s3": {**MINIMAL["s3"], "bucket": 42}}, "/s3/bucket': got number, want string"),
    (
        {"s3": {**MINIMAL["s3"], "bucket": "My_Bucket"}},
        "/s3/bucket': 'My_Bucket' does not match pattern",
    ),
    ({**MINIMAL, "mlflow": {"backendStore": {"type": "mysql"}}}, "/mlflow/backendStore/type'"),
    (
        {**MINIMAL, "s3": {**MINIMAL["s3"], "bukcet": "typo"}},
        "additional properties 'bukcet' not allowed",
    ),
    (
        {**MINIMAL, "pipeline": {"register": {"recurringRun": {"cron": "daily"}}}},
        "/pipeline/register/recurringRun/cron'",
    ),
]


@pytest.mark.parametrize(("values", "message"), BAD_SCHEMA)
def test_schema_rejects_bad_values_with_the_path(chart, values, message):
    with pytest.raises(Exception, match="schema") as err:
        chart.render(values, name=RELEASE, namespace=NAMESPACE)
    assert message in str(err.value)


def test_schema_forbids_unknown_keys_everywhere():
    schema = json.loads((CHART / "values.schema.json").read_text())
    open_maps = {
        "global",  # Helm's own: a subchart receives its parent's globals
        "podLabels",
        "podAnnotations",
        "jobPodLabels",
        "config",
        "podSecurityContext",
        "securityContext",
        "nodeSelector",
        "annotations",
        "requests",
        "limits",
    }

    def walk(node, name="<root>"):
        if node.get("type") == "object" and name not in open_maps:
            assert node.get("additionalProperties") is False, name
            for key, sub in node["properties"].items():
                walk(sub, key)

    walk(schema)


# ---- pipeline config and registration -----------------------------------------------------


@pytest.mark.parametrize("name", ["gpu", "irsa"])
def test_pipeline_config_carries_images_gpu_placement_and_secret(chart, name):
    values = values_for(name)
    docs = render(chart, values)
    cfg = pipeline_config(docs)
    k8s = cfg["kubernetes"]
    cpu, gpu = build_sh_refs("--only", "cpu") + build_sh_refs("--only", "gpu")
    assert (k8s["image"], k8s["gpu_image"]) == (cpu, gpu)
    g = values["pipeline"]["gpu"]
    assert (k8s["rollout_gpus"], k8s["train_gpus"]) == (g["rollout"], g["train"])
    assert k8s["node_selector"] == g["nodeSelector"]
    assert k8s["tolerations"] == g["tolerations"]
    assert (
        cfg["tracking"]["tracking_uri"]
        == f"http://{RELEASE}-mlflow.{NAMESPACE}.svc.cluster.local:5000"
    )
    assert cfg["storage"]["root"].startswith(f"s3://{values['s3']['bucket']}/")
    assert cfg["storage"]["region"] == values["s3"]["region"]
    if name == "gpu":
        assert k8s["s3_secret"] == "sparring-s3"
        for key, value in values["pipeline"]["config"].items():  # passed through unchanged
            assert cfg[key] == value
    else:
        assert k8s["s3_secret"] is None  # IRSA: no Secret to mount
    # the Job compiles exactly this file: it is mounted from that ConfigMap at PIPELINE_CONFIG
    job = by_kind(docs, "Job")[f"{RELEASE}-register-r1"]["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in job["containers"][0]["env"]}
    config_volume = next(v for v in job["volumes"] if v["name"] == "config")
    assert config_volume["configMap"]["name"] == f"{RELEASE}-pipeline"
    assert env["PIPELINE_CONFIG"] == "/etc/sparring/pipeline.yaml"
    assert env["PIPELINE_VERSION_PREFIX"] == sparring.__version__  # + the content's hash


def test_upgrade_registers_with_the_same_settings(chart):
    docs = render(chart, values_for("gpu"), revision=7)
    job = by_kind(docs, "Job")[f"{RELEASE}-register-r7"]["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in job["containers"][0]["env"]}
    assert env["PIPELINE_VERSION_PREFIX"] == sparring.__version__  # no revision: by content
    assert env["RECURRING_RUN_CRON"] == "0 0 2 * * *"


def _pipeline_config_importable() -> bool:
    try:
        import sparring.loop.config  # noqa: F401
    except ImportError:
        return False
    return True


needs_pipeline = pytest.mark.skipif(
    not _pipeline_config_importable(),
    reason="sparring.loop.config (issue 4) does not import yet",
)


@needs_pipeline
@pytest.mark.parametrize("name", list(VALUES_FILES))
def test_rendered_config_is_a_valid_pipeline_config(chart, name):
    from sparring.loop.config import GPU_IMAGE, IMAGE, PipelineConfig

    cfg = PipelineConfig.model_validate(pipeline_config(render(chart, values_for(name))))
    if "image" not in values_for(name):  # default repository: the same refs as the library's
        assert (cfg.kubernetes.image, cfg.kubernetes.gpu_image) == (IMAGE, GPU_IMAGE)


@needs_pipeline
def test_compiled_pipeline_uses_the_chart_images_and_gpu_values(chart, tmp_path):
    cfg_path = tmp_path / "pipeline.yaml"
    cfg_path.write_text(yaml.safe_dump(pipeline_config(render(chart, values_for("gpu")))))
    out = tmp_path / "ir.yaml"
    sparring_cli = str(Path(sys.executable).parent / "sparring")
    subprocess.run(
        [sparring_cli, "compile", "--config", str(cfg_path), "-o", str(out)],
        check=True,
        capture_output=True,
    )
    ir = next(yaml.safe_load_all(out.read_text()))
    images = {ex["container"]["image"] for ex in ir["deploymentSpec"]["executors"].values()}
    assert images == set(build_sh_refs()[:2])  # CPU tasks on -cpu, GPU tasks on -gpu, nothing else
    text = out.read_text()
    assert "NVIDIA-H100-80GB-HBM3" in text and "nvidia.com/gpu" in text and "sparring-s3" in text


class FakeKfp:
    """Records calls; pipelines, versions, experiments and recurring runs live in dicts."""

    def __init__(self, pipelines=None, recurring=None, experiment="sparring-nightly"):
        self.pipelines = dict(pipelines or {})  # name -> id
        self.versions: dict[tuple[str, str], str] = {}  # (pipeline id, version name) -> id
        self.experiments = {experiment} if recurring else set()  # the recurring runs' experiment
        # recurring run id -> [name, version id, enabled]
        self.recurring = {k: [n, "?", True] for k, n in (recurring or {}).items()}
        self.calls: list[str] = []

    def get_pipeline_id(self, name):
        self.calls.append("get_pipeline_id (shared)")
        return self.pipelines.get(name)

    def list_pipelines(self, page_size, filter, namespace):
        self.calls.append(f"list_pipelines {namespace}")
        wanted = json.loads(filter)["predicates"][0]["string_value"]
        pid = self.pipelines.get((namespace, wanted))
        return SimpleNamespace(pipelines=[SimpleNamespace(pipeline_id=pid)] if pid else None)

    def upload_pipeline(self, package, pipeline_name, description, namespace=None):
        self.calls.append("upload_pipeline" + (f" {namespace}" if namespace else ""))
        pid = f"p-{pipeline_name}"
        self.pipelines[(namespace, pipeline_name) if namespace else pipeline_name] = pid
        self.versions[(pid, pipeline_name)] = "v-first"
        return SimpleNamespace(pipeline_id=pid)

    def list_pipeline_versions(self, pipeline_id, page_size=10, filter=None):
        wanted = json.loads(filter)["predicates"][0]["string_value"] if filter else None
        found = [
            SimpleNamespace(pipeline_version_id=vid)
            for (pid, name), vid in self.versions.items()
            if pid == pipeline_id and (wanted is None or name == wanted)
        ]
        return SimpleNamespace(pipeline_versions=found or None)

    def upload_pipeline_version(self, package, pipeline_version_name, pipeline_id, description):
        self.calls.append("upload_pipeline_version")
        self.versions[(pipeline_id, pipeline_version_name)] = f"v-{pipeline_version_name}"
        return SimpleNamespace(pipeline_version_id=f"v-{pipeline_version_name}")

    def get_experiment(self, experiment_name, namespace=None):
        if experiment_name not in self.experiments:
            raise ValueError(f"No experiment is found with name {experiment_name}.")
        return SimpleNamespace(experiment_id=f"e-{experiment_name}")

    def create_experiment(self, name, namespace=None):
        self.experiments.add(name)
        return SimpleNamespace(experiment_id=f"e-{name}")

    def list_recurring_runs(self, experiment_id, page_size):
        runs = [
            SimpleNamespace(recurring_run_id=i, display_name=n)
            for i, (n, _, _) in self.recurring.items()
        ]
        return SimpleNamespace(recurring_runs=runs or None)

    def delete_recurring_run(self, rid):
        self.calls.append(f"delete {rid}")
        del self.recurring[rid]

    def disable_recurring_run(self, rid):
        self.calls.append(f"disable {rid}")
        self.recurring[rid][2] = False

    def create_recurring_run(self, experiment_id, job_name, **kw):
        self.calls.append(f"create_recurring_run {kw['version_id']} {kw['cron_expression']}")
        self.recurring[f"r{len(self.calls)}"] = [job_name, kw["version_id"], True]
        return SimpleNamespace(recurring_run_id=f"r{len(self.calls)}")

    def enabled(self, name: str) -> list[str]:
        """The versions the enabled recurring runs called `name` start."""
        return [v for n, v, on in self.recurring.values() if n == name and on]


HEALTHY = {"commit_sha": "abc", "tag_name": "2.17.0", "multi_user": False}


@pytest.fixture()
def register(tmp_path, monkeypatch):
    """The chart's script; its `sparring compile` stand-in writes the rendered config as the
    package, so the version's content hash follows the config."""
    module = load_module(CHART / "files" / "register_pipeline.py", "register_pipeline")
    module.targets = []  # the KFP release each compile was for

    def compile_pipeline(cfg: str, pkg: str, kfp_version: str) -> None:
        module.targets.append(kfp_version)
        Path(pkg).write_text(Path(cfg).read_text())

    monkeypatch.setattr(module, "compile_pipeline", compile_pipeline)
    return module


def hook_env(docs: list[dict], job: str, tmp_path: Path) -> dict[str, str]:
    """A hook Job's env, its rendered config written where `PIPELINE_CONFIG` points."""
    spec = by_kind(docs, "Job")[job]["spec"]["template"]["spec"]
    env = {e["name"]: e["value"] for e in spec["containers"][0]["env"]}
    config = tmp_path / f"{job}.yaml"
    config.write_text(pipeline_config_text(docs))
    return env | {"PIPELINE_CONFIG": str(config), "PIPELINE_PACKAGE": str(tmp_path / "ir.yaml")}


def test_register_creates_then_versions_then_is_idempotent(register, chart, tmp_path):
    docs = render(chart, values_for("gpu"), revision=2)
    env = hook_env(docs, f"{RELEASE}-register-r2", tmp_path)  # the Job's real env
    version = register.version_name(sparring.__version__, env["PIPELINE_CONFIG"])

    client = FakeKfp()
    assert register.main(env, client, healthz=HEALTHY) == 0
    assert client.calls == [
        "get_pipeline_id (shared)",
        "upload_pipeline",
        "upload_pipeline_version",  # named by content, not after the pipeline
        f"create_recurring_run v-{version} 0 0 2 * * *",
    ]

    existing = FakeKfp(
        pipelines={"sparring-selfplay-gpu": "p1"},
        recurring={"old": "sparring-selfplay-gpu-recurring", "x": "other"},
    )
    register.main(env, existing, healthz=HEALTHY)
    assert existing.calls == [
        "get_pipeline_id (shared)",
        "upload_pipeline_version",
        "delete old",
        f"create_recurring_run v-{version} 0 0 2 * * *",
    ]
    assert "x" in existing.recurring  # other recurring runs are left alone
    existing.calls.clear()
    once = {k: v for k, v in env.items() if not k.startswith("RECURRING")}
    register.main(once, existing, healthz=HEALTHY)
    assert existing.calls == ["get_pipeline_id (shared)"]  # a retried Job uploads nothing twice
    # compiled for the backend it found: 2.17 keeps the run deadline, 2.16 parses its spec
    register.main(once, existing, healthz={**HEALTHY, "tag_name": "2.16.0"})
    assert register.targets == ["2.17", "2.17", "2.17", "2.16"]


def test_the_compile_target_follows_the_backend(register):
    target = register.compile_target
    assert [target(t) for t in ("2.17.0", "v2.18.1", "2.16.9", "2.14.0", "unknown")] == [
        "2.17",
        "2.17",
        "2.16",
        "2.16",
        "2.16",
    ]


def test_install_uninstall_reinstall_and_rollback(register, chart, tmp_path):
    """The hooks as rendered, in Helm's order, against one KFP: uninstall disables the
    recurring run; a reinstall of a changed chart uploads a new version (never the stale one)
    and re-enables it; a rollback points it back at the version of the rolled-back config."""
    name = "sparring-selfplay-gpu-recurring"
    kfp = FakeKfp()

    def hook(values: dict, revision: int, job: str) -> None:
        docs = render(chart, values, revision=revision)
        action = by_kind(docs, "Job")[f"{RELEASE}-{job}-r{revision}"]
        assert action["spec"]["template"]["spec"]["containers"][0]["command"][-1] == job
        env = hook_env(docs, f"{RELEASE}-{job}-r{revision}", tmp_path)
        assert register.main(env, kfp, healthz=HEALTHY, action=job) == 0

    def version(values: dict) -> str:
        config = tmp_path / "v.yaml"
        config.write_text(pipeline_config_text(render(chart, values)))
        return f"v-{register.version_name(sparring.__version__, str(config))}"

    old, new = (
        values_for("gpu"),
        {**values_for("gpu"), "pipeline": {**values_for("gpu")["pipeline"], "retries": 3}},
    )
    assert version(old) != version(new)
    hook(old, 1, "register")  # helm install
    assert kfp.enabled(name) == [version(old)]
    hook(old, 1, "disable")  # helm uninstall: pre-delete
    assert kfp.enabled(name) == [] and len(kfp.recurring) == 1
    hook(new, 1, "register")  # helm install again, a changed chart
    assert kfp.enabled(name) == [version(new)] and len(kfp.recurring) == 1
    hook(old, 2, "register")  # helm upgrade back to the old values: its version is found
    assert kfp.calls.count("upload_pipeline_version") == 2
    hook(new, 3, "register")  # helm upgrade
    hook(old, 4, "register")  # helm rollback 2: post-rollback, the old config again
    assert kfp.enabled(name) == [version(old)] and len(kfp.recurring) == 1
    assert kfp.calls.count("upload_pipeline_version") == 2  # nothing uploaded twice
    no_cron = copy.deepcopy(old)
    no_cron["pipeline"]["register"]["recurringRun"]["enabled"] = False
    hook(no_cron, 5, "register")  # an upgrade that turns the recurring run off disables it
    assert kfp.enabled(name) == []


# ---- scripts the chart runs, against real servers -----------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def bundled_s3(tmp_path_factory):
    """The chart's SeaweedFS entry point, run for real with the venv's `weed`."""
    port = _free_port()
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "S3_BUCKET": "sparring-dev",
        "AWS_ACCESS_KEY_ID": "dev-key",
        "AWS_SECRET_ACCESS_KEY": "dev-secret",
        "DATA_DIR": str(tmp_path_factory.mktemp("weed")),
        "S3_PORT": str(port),
        "BIND_IP": "127.0.0.1",
        "READY_TIMEOUT": "30",
    }
    proc = subprocess.Popen(
        [sys.executable, str(CHART / "files" / "seaweedfs_entry.py")],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    line = proc.stdout.readline()
    assert "bucket 'sparring-dev' ready" in line, line
    yield f"http://127.0.0.1:{port}", env
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise


class _Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server API
        ok = self.path == "/health"
        self.send_response(200 if ok else 404)
        self.end_headers()
        self.wfile.write(b"OK" if ok else b"")

    def log_message(self, *args):
        pass


def test_smoke_test_script_checks_mlflow_and_s3(bundled_s3, monkeypatch):
    endpoint, env = bundled_s3
    smoke = load_module(CHART / "files" / "smoke_test.py", "smoke_test")
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(key, env[key])
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", endpoint)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    assert smoke.check_s3("sparring-dev", "sparring").startswith(
        "s3://sparring-dev/sparring/.helm-test/"
    )

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        assert smoke.check_mlflow(f"http://127.0.0.1:{server.server_port}") == "OK"
    finally:
        server.shutdown()
    with pytest.raises(SystemExit, match="did not answer /health"):
        smoke.check_mlflow(f"http://127.0.0.1:{_free_port()}", attempts=2, delay=0.05)

    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
    with pytest.raises(SystemExit, match="FAIL: S3 bucket 'sparring-dev' not writable"):
        smoke.check_s3("sparring-dev", "sparring")


def test_bundled_s3_creates_the_bucket_and_requires_keys(bundled_s3):
    import boto3
    from botocore.config import Config

    endpoint, env = bundled_s3
    cfg = Config(retries={"max_attempts": 1}, s3={"addressing_style": "path"})
    good = boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        config=cfg,
        aws_access_key_id="dev-key",
        aws_secret_access_key="dev-secret",
    )
    names = [b["Name"] for b in good.list_buckets()["Buckets"]]
    assert names == ["sparring-dev"]
    bad = boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        config=cfg,
        aws_access_key_id="dev-key",
        aws_secret_access_key="nope",
    )
    with pytest.raises(Exception, match="SignatureDoesNotMatch|AccessDenied|InvalidAccessKeyId"):
        bad.list_buckets()


# ---- docs ----------------------------------------------------------------------------------


def test_every_values_key_is_documented_and_readme_is_current():
    gen = load_module(CHART / "hack" / "gen_readme.py", "gen_readme")
    text = (CHART / "values.yaml").read_text()
    assert gen.undocumented(text) == []
    assert (CHART / "README.md").read_text() == gen.render(text), (
        "run python helm/sparring/hack/gen_readme.py"
    )
    # the checker itself notices a missing comment
    assert gen.undocumented(text + "newKey: 1\n") == ["newKey"]


def test_notes_say_how_to_reach_mlflow_and_kfp(chart):
    notes = chart.render(MINIMAL, name=RELEASE, namespace=NAMESPACE)["sparring/templates/NOTES.txt"]
    assert f"port-forward svc/{RELEASE}-mlflow 5000:5000" in notes
    assert "ml-pipeline-ui" in notes
    gpu_notes = chart.render(values_for("gpu"), name=RELEASE, namespace=NAMESPACE)[
        "sparring/templates/NOTES.txt"
    ]
    assert "https://kubeflow.example.com/pipeline" in gpu_notes


# ---- issue 18: the chart next to Kubeflow ----------------------------------------------------


def probe_chart(tmp_path: Path, existing_yaml: str) -> Chart:
    """A copy of the chart plus one template that runs the real pre-flight helper on a stubbed
    lookup result (helm-python-sdk renders offline, where `lookup` is always empty)."""
    import shutil

    copy = tmp_path / "sparring"
    shutil.copytree(CHART, copy)
    (copy / "templates" / "zz-preflight-probe.yaml").write_text(
        "{{- $existing := fromYaml " + json.dumps(existing_yaml) + " }}\n"
        '{{- include "sparring.launcherPreflight" (dict "ctx" . "existing" $existing) }}\n'
    )
    return Chart.load(str(copy))


KFP_OWN_LAUNCHER = "metadata: {name: kfp-launcher, namespace: kubeflow, labels: {app: kfp}}"


def test_launcher_preflight_refuses_to_take_over_kfps_configmap(tmp_path):
    create = {**MINIMAL, "kfp": {"launcher": {"create": True}}}
    chart = probe_chart(tmp_path, KFP_OWN_LAUNCHER)
    with pytest.raises(Exception, match="ConfigMap kfp-launcher already exists") as err:
        chart.render(create, name=RELEASE, namespace=NAMESPACE)
    assert "kfp.launcher.create=false" in str(err.value) and "docs/cluster.md" in str(err.value)
    # the default (no creation) never fails, whatever exists
    assert chart.render(MINIMAL, name=RELEASE, namespace=NAMESPACE)
    # an upgrade of the release that created it passes
    ours = (
        "metadata: {name: kfp-launcher, annotations: {meta.helm.sh/release-name: sparring, "
        "meta.helm.sh/release-namespace: kubeflow}}"
    )
    assert probe_chart(tmp_path / "b", ours).render(create, name=RELEASE, namespace=NAMESPACE)
    # ... but another release's does not
    other = ours.replace("release-name: sparring", "release-name: other")
    with pytest.raises(Exception, match="owned by other"):
        probe_chart(tmp_path / "c", other).render(create, name=RELEASE, namespace=NAMESPACE)


def test_launcher_template_runs_the_preflight_on_the_run_namespace():
    text = (CHART / "templates" / "kfp-launcher-configmap.yaml").read_text()
    assert (
        '"sparring.launcherPreflight" (dict "ctx" . "existing" (lookup "v1" "ConfigMap" '
        '(include "sparring.kfpNamespace" .) "kfp-launcher"))' in text
    )


@pytest.mark.parametrize("name", ["minimal", "irsa", "local", "multi-user"])
def test_launcher_patch_in_notes_equals_what_the_chart_would_create(chart, name):
    values = values_for(name)
    ns = NAMESPACES.get(name, NAMESPACE)
    patch = launcher_patch(chart, values, ns)
    created = render(
        chart,
        {**values, "kfp": {**values.get("kfp", {}), "launcher": {"create": True}}},
        namespace=ns,
    )
    cm = by_kind(created, "ConfigMap")["kfp-launcher"]
    kubernetes_validate.validate(cm, KUBE_VERSION, strict=True)
    assert cm["metadata"]["namespace"] == ns and cm["data"] == patch
    providers = yaml.safe_load(patch["providers"])["s3"]["default"]
    assert patch["defaultPipelineRoot"].startswith(f"s3://{values['s3']['bucket']}/")
    if values["s3"]["credentials"].get("mode", "secret") == "serviceAccount":
        assert providers["credentials"] == {"fromEnv": True}
    else:
        assert (
            providers["credentials"]["secretRef"]["secretName"]
            == pipeline_config(created)["kubernetes"]["s3_secret"]
        )
    notes = chart.render(values, name=RELEASE, namespace=ns)["sparring/templates/NOTES.txt"]
    # the profile's own kfp-launcher, never the cluster-wide pipeline-install-config (which the
    # profile controller ignores from KFP 2.15 and which reaches every profile before)
    assert "patch configmap pipeline-install-config" not in notes


ARGO_EXECUTOR_NEEDS = [
    ("argoproj.io", "workflowtaskresults", "create"),
    ("argoproj.io", "workflowtaskresults", "patch"),
    ("", "configmaps", "get"),
    ("", "configmaps", "list"),
    ("", "configmaps", "watch"),
    ("", "pods", "get"),
    ("", "pods", "patch"),
]


def allows(role: dict, group: str, resource: str, verb: str) -> bool:
    return any(
        group in r["apiGroups"]
        and (resource in r["resources"] or "*" in r["resources"])
        and (verb in r["verbs"] or "*" in r["verbs"])
        for r in role["rules"]
    )


@pytest.mark.parametrize("name", ["minimal", "irsa", "multi-user"])
def test_the_chart_account_is_a_real_runner(chart, name):
    docs = render_named(chart, name)
    sa = by_kind(docs, "ServiceAccount")[RELEASE]
    assert sa["automountServiceAccountToken"] is True  # Argo's executor calls the API with it
    role = by_kind(docs, "Role")[f"{RELEASE}-runner"]
    for need in ARGO_EXECUTOR_NEEDS:
        assert allows(role, *need), need
    binding = by_kind(docs, "RoleBinding")[f"{RELEASE}-runner"]
    assert binding["roleRef"]["name"] == f"{RELEASE}-runner"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": RELEASE, "namespace": NAMESPACES.get(name, NAMESPACE)}
    ]


def test_recurring_runs_use_the_runner_account(chart):
    docs = render(chart, values_for("gpu"))
    job = by_kind(docs, "Job")[f"{RELEASE}-register-r1"]["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in job["containers"][0]["env"]}
    assert env["RECURRING_RUN_SERVICE_ACCOUNT"] == RELEASE


def test_sparring_submit_passes_the_service_account(monkeypatch, tmp_path):
    """`sparring submit --service-account` reaches kfp.Client.run_pipeline (one iteration: a
    run within the per-run cap, not a campaign)."""
    from click.testing import CliRunner

    from sparring.cli import submit as submit_cli

    calls = {}

    class Client:
        def __init__(self, host, namespace=None):
            calls["host"] = host

        def get_pipeline_id(self, name):
            return "p1"

        def list_pipeline_versions(self, pipeline_id, filter=None):
            return SimpleNamespace(pipeline_versions=None)  # no version of this content yet

        def upload_pipeline_version(self, package, name, pipeline_id):
            return SimpleNamespace(pipeline_version_id="v1")

        def create_experiment(self, name):
            return SimpleNamespace(experiment_id="e1")

        def run_pipeline(self, experiment_id, run_name, **kw):
            calls.update(kw)
            return SimpleNamespace(run_id="r1")

    import kfp

    monkeypatch.setattr(kfp, "Client", Client)
    cfg = tmp_path / "pipeline-gpu.yaml"
    data = yaml.safe_load((ROOT / "configs" / "pipeline-gpu.yaml").read_text())
    cfg.write_text(yaml.safe_dump({**data, "iterations": 1}))
    result = CliRunner().invoke(
        submit_cli.command,
        ["--host", "http://kfp", "--config", str(cfg), "--service-account", RELEASE],
    )
    assert result.exit_code == 0, result.output
    assert calls["service_account"] == RELEASE and calls["version_id"] == "v1"


def test_multi_user_uploads_into_the_profile_and_jobs_have_no_sidecar(chart, register, tmp_path):
    docs = render_named(chart, "multi-user")
    edit = by_kind(docs, "RoleBinding")[f"{RELEASE}-kfp-edit"]
    assert edit["metadata"]["namespace"] == "team-a"
    assert edit["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": "kubeflow-pipelines-edit",
    }
    job = by_kind(docs, "Job")[f"{RELEASE}-register-r1"]["spec"]["template"]
    env = {e["name"]: e.get("value") for e in job["spec"]["containers"][0]["env"]}
    assert env["KFP_NAMESPACE"] == "team-a" and env["KFP_MULTI_USER"] == "true"
    token = next(v for v in job["spec"]["volumes"] if v["name"] == "kfp-token")
    assert token["projected"]["sources"][0]["serviceAccountToken"]["audience"] == (
        "pipelines.kubeflow.org"
    )
    test_pod = by_kind(docs, "Pod")[f"{RELEASE}-test"]
    for meta in (job["metadata"], test_pod["metadata"]):
        assert meta["labels"]["sidecar.istio.io/inject"] == "false"
        assert meta["labels"]["team"] == "a"  # podLabels reach every pod
    mlflow = by_kind(docs, "Deployment")[f"{RELEASE}-mlflow"]["spec"]["template"]["metadata"]
    assert "sidecar.istio.io/inject" not in mlflow["labels"]  # servers keep the mesh
    assert mlflow["annotations"]["cluster-autoscaler.kubernetes.io/safe-to-evict"] == "true"
    # the Job's script uploads into the namespace, never as a shared pipeline
    client = FakeKfp()
    health = {**HEALTHY, "multi_user": True}
    env = hook_env(docs, f"{RELEASE}-register-r1", tmp_path)
    assert register.main(env, client, healthz=health) == 0
    assert client.calls[:2] == ["list_pipelines team-a", "upload_pipeline team-a"]


def test_jobs_keep_the_sidecar_when_asked(chart):
    docs = render(chart, {**MINIMAL, "jobPodLabels": {"sidecar.istio.io/inject": "true"}})
    job = by_kind(docs, "Job")[f"{RELEASE}-register-r1"]["spec"]["template"]["metadata"]
    assert job["labels"]["sidecar.istio.io/inject"] == "true"


def test_release_must_live_in_the_run_namespace(chart):
    with pytest.raises(Exception, match="kfp.namespace=team-a must be the release namespace"):
        chart.render({**MINIMAL, "kfp": {"namespace": "team-a"}}, name=RELEASE, namespace="x")


@pytest.mark.parametrize(
    ("name", "minimum"),
    [("minimal", "2.14.0"), ("gpu", "2.14.0"), ("irsa", "2.17.0"), ("multi-user", "2.17.0")],
)
def test_job_requires_the_kfp_version_the_install_needs(chart, name, minimum):
    job = by_kind(render_named(chart, name), "Job")[f"{RELEASE}-register-r1"]
    env = {
        e["name"]: e.get("value") for e in job["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["KFP_MIN_VERSION"] == minimum


def test_register_fails_early_on_old_or_mismatched_kfp(register):
    assert register.check_backend({"tag_name": "2.17.1", "multi_user": False}, "2.17.0", False)
    assert register.check_backend({"tag_name": "v2.14.0", "multi_user": True}, "2.14.0", True)
    with pytest.raises(SystemExit, match=r"KFP 2\.13\.0 is too old .* needs 2\.14\.0"):
        register.check_backend({"tag_name": "2.13.0", "multi_user": False}, "2.14.0", False)
    with pytest.raises(SystemExit, match=r"needs 2\.17\.0"):
        register.check_backend({"tag_name": "2.16.9", "multi_user": False}, "2.17.0", False)
    with pytest.raises(SystemExit, match="multi-user but the chart has kfp.multiUser=false"):
        register.check_backend({"tag_name": "2.17.0", "multi_user": True}, "2.14.0", False)
    # a dev build without a version passes (with a warning)
    assert register.check_backend({"tag_name": "unknown"}, "2.14.0", False) == "unknown"


def test_register_reads_the_real_healthz_json(register):
    body = b'{"commit_sha":"abc", "tag_name":"2.17.0", "multi_user":false, "pipeline_store": "database"}'

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server API
            ok = self.path == "/apis/v2beta1/healthz"
            self.send_response(200 if ok else 404)
            self.end_headers()
            self.wfile.write(body if ok else b"")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        health = register.get_healthz(f"http://127.0.0.1:{server.server_port}")
    finally:
        server.shutdown()
    assert register.check_backend(health, "2.14.0", False) == "2.17.0"


def test_chart_states_the_supported_kfp_versions():
    meta = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert "2.14" in meta["annotations"]["sparring/kfp-versions"]
    assert "2.17" in meta["annotations"]["sparring/kfp-versions"]


def services(docs: list[dict]) -> set[str]:
    """`http://<name>.<namespace>.svc.cluster.local:<port>` of every Service rendered."""
    return {
        f"http://{d['metadata']['name']}.{ns}.svc.cluster.local:{p['port']}"
        for d in docs
        if d["kind"] == "Service"
        for p in d["spec"]["ports"]
        for ns in [d["metadata"].get("namespace", NAMESPACE)]
    }


@pytest.mark.parametrize("name", list(VALUES_FILES))
def test_pipeline_config_names_services_the_chart_creates(chart, name):
    values = values_for(name)
    ns = NAMESPACES.get(name, NAMESPACE)
    docs = render_named(chart, name)
    cfg = pipeline_config(docs)
    made = {u.replace(f".{NAMESPACE}.", f".{ns}.") for u in services(docs)}
    uri = cfg["tracking"]["tracking_uri"]
    if values.get("mlflow", {}).get("enabled", True):
        prefix = values.get("mlflow", {}).get("staticPrefix", "")
        assert uri.removesuffix(prefix) in made, (uri, made)
    endpoint = cfg["storage"]["endpoint_url"]
    if values.get("seaweedfs", {}).get("enabled"):
        assert endpoint in made
    else:
        assert endpoint == (values["s3"].get("endpoint") or None)


def test_shipped_gpu_config_is_the_charts_render():
    """configs/pipeline-gpu.yaml is what `helm install sparring -n kubeflow -f
    values-gpu.yaml` puts in its ConfigMap: endpoints, Secret and images included."""
    chart = Chart.load(str(CHART))
    rendered = pipeline_config(render(chart, values_for("gpu")))
    shipped = yaml.safe_load((ROOT / "configs" / "pipeline-gpu.yaml").read_text())
    assert shipped == rendered
    assert shipped["tracking"]["tracking_uri"] in services(render(chart, values_for("gpu")))


# ---- issue 18: hardening and operations -------------------------------------------------------


def test_network_policies_admit_only_pipeline_pods_the_ui_and_the_release(chart):
    docs = render(chart, values_for("local"))
    policies = by_kind(docs, "NetworkPolicy")
    assert set(policies) == {f"{RELEASE}-mlflow", f"{RELEASE}-s3", f"{RELEASE}-ray"}
    for component, port in (("mlflow", 5000), ("s3", 8333)):
        spec = policies[f"{RELEASE}-{component}"]["spec"]
        assert spec["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == component
        (rule,) = spec["ingress"]
        assert rule["ports"] == [{"port": port, "protocol": "TCP"}]
        peers = rule["from"]
        pipeline = peers[0]
        assert pipeline["namespaceSelector"]["matchLabels"] == {
            "kubernetes.io/metadata.name": NAMESPACE
        }
        assert pipeline["podSelector"]["matchExpressions"][0]["key"] == (
            "workflows.argoproj.io/workflow"
        )
        assert {"app.kubernetes.io/instance": RELEASE} in [
            p.get("podSelector", {}).get("matchLabels") for p in peers
        ]
        ui = [p for p in peers if "matchExpressions" in p.get("podSelector", {})][-1]
        assert ui["podSelector"]["matchExpressions"][0]["values"] == [
            "ml-pipeline-ui",
            "ml-pipeline",
        ]
        assert not any(p == {} or p.get("podSelector") == {} for p in peers)  # nobody else
    ext = by_kind(render(chart, values_for("external")), "NetworkPolicy")[f"{RELEASE}-mlflow"]
    assert ext["spec"]["ingress"][0]["from"][-1]["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "ingress-nginx"
    }
    assert "NetworkPolicy" not in {
        d["kind"] for d in render(chart, {**MINIMAL, "networkPolicy": {"enabled": False}})
    }


def test_pdb_only_with_replicas(chart):
    assert "PodDisruptionBudget" not in {d["kind"] for d in render(chart, MINIMAL)}
    pdb = by_kind(render(chart, values_for("gpu")), "PodDisruptionBudget")[f"{RELEASE}-mlflow"]
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == "mlflow"


def test_db_upgrade_runs_once_before_mlflow_and_really_migrates(chart, tmp_path):
    docs = render(chart, values_for("gpu"))
    hook = by_kind(docs, "Job")[f"{RELEASE}-mlflow-db-upgrade"]
    assert hook["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    container = hook["spec"]["template"]["spec"]["containers"][0]
    mlflow = by_kind(docs, "Deployment")[f"{RELEASE}-mlflow"]["spec"]["template"]["spec"]
    assert "initContainers" not in mlflow  # postgres: the replicas do not migrate
    sqlite = by_kind(render(chart, MINIMAL), "Deployment")[f"{RELEASE}-mlflow"]["spec"]["template"]
    (init,) = sqlite["spec"]["initContainers"]
    assert f"{RELEASE}-mlflow-db-upgrade" not in by_kind(render(chart, MINIMAL), "Job")
    assert init["command"] == container["command"]
    # run the rendered command for real against a sqlite store: it creates the schema, then is a
    # no-op on the current one
    db = tmp_path / "mlflow.db"
    argv = [
        a.replace("$(MLFLOW_BACKEND_STORE_URI)", f"sqlite:///{db}") for a in container["command"]
    ]
    argv[0] = str(Path(sys.executable).parent / argv[0])
    for _ in range(2):
        done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
    import sqlite3

    with sqlite3.connect(db) as con:
        (head,) = con.execute("select version_num from alembic_version").fetchone()
        tables = {r[0] for r in con.execute("select name from sqlite_master")}
    assert head and {"experiments", "registered_models", "model_versions"} <= tables


def test_one_worker_on_sqlite(chart):
    def workers(values):
        mlflow = by_kind(render(chart, values), "Deployment")[f"{RELEASE}-mlflow"]
        return [
            a for a in mlflow["spec"]["template"]["spec"]["containers"][0]["args"] if "workers" in a
        ]

    assert workers(MINIMAL) == ["--workers=1"]
    assert workers(values_for("gpu")) == ["--workers=2"]  # postgres
    with pytest.raises(Exception, match="sqlite takes one MLflow worker"):
        chart.render({**MINIMAL, "mlflow": {"workers": 2}}, name=RELEASE, namespace=NAMESPACE)


def test_ingress_and_httproute_serve_mlflow_under_its_static_prefix(chart):
    docs = render(chart, values_for("external"))
    mlflow = by_kind(docs, "Deployment")[f"{RELEASE}-mlflow"]["spec"]["template"]["spec"]
    c = mlflow["containers"][0]
    assert "--static-prefix=/mlflow" in c["args"]
    assert c["readinessProbe"]["httpGet"]["path"] == "/mlflow/health"
    ing = by_kind(docs, "Ingress")[f"{RELEASE}-mlflow"]["spec"]
    (path,) = ing["rules"][0]["http"]["paths"]
    assert path["path"] == "/mlflow" and path["backend"]["service"]["name"] == f"{RELEASE}-mlflow"
    assert ing["tls"] == [{"hosts": ["tools.example.com"], "secretName": "tools-tls"}]
    assert pipeline_config(docs)["tracking"]["tracking_uri"].endswith(":5000/mlflow")
    values = {
        **MINIMAL,
        "mlflow": {
            "staticPrefix": "/mlflow",
            "httpRoute": {"enabled": True, "parentRefs": [{"name": "main", "namespace": "gw"}]},
        },
    }
    docs = render(chart, values)
    validate_strict(docs)
    route = by_kind(docs, "HTTPRoute")[f"{RELEASE}-mlflow"]
    assert route["apiVersion"] == "gateway.networking.k8s.io/v1"
    (rule,) = route["spec"]["rules"]
    assert rule["matches"] == [{"path": {"type": "PathPrefix", "value": "/mlflow"}}]
    assert rule["backendRefs"] == [{"name": f"{RELEASE}-mlflow", "port": 5000}]
    assert route["spec"]["parentRefs"] == [{"name": "main", "namespace": "gw"}]
    with pytest.raises(Exception, match="needs mlflow.httpRoute.parentRefs"):
        chart.render(
            {**MINIMAL, "mlflow": {"httpRoute": {"enabled": True}}},
            name=RELEASE,
            namespace=NAMESPACE,
        )


def test_chart_works_as_a_subchart_with_globals(chart):
    docs = render(chart, {**MINIMAL, "global": {"imageRegistry": "x", "storageClass": "y"}})
    assert by_kind(docs, "Deployment")


@needs_pipeline
def test_hf_token_and_model_cache_reach_every_task(chart, tmp_path):
    docs = render(chart, values_for("external"))
    secret = by_kind(docs, "Secret")[f"{RELEASE}-hf"]
    assert secret["stringData"] == {"HF_TOKEN": "hf_dummy_token_for_ci"}
    pvc = by_kind(docs, "PersistentVolumeClaim")[f"{RELEASE}-model-cache"]
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    cfg = pipeline_config(docs)
    assert cfg["kubernetes"]["hf_secret"] == f"{RELEASE}-hf"
    assert cfg["kubernetes"]["model_cache_pvc"] == f"{RELEASE}-model-cache"
    cfg_path = tmp_path / "pipeline.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg))
    out = tmp_path / "ir.yaml"
    sparring_cli = str(Path(sys.executable).parent / "sparring")
    subprocess.run([sparring_cli, "compile", "--config", str(cfg_path), "-o", str(out)], check=True)
    platform = list(yaml.safe_load_all(out.read_text()))[1]["platforms"]["kubernetes"]
    executors = platform["deploymentSpec"]["executors"]
    assert executors
    for spec in executors.values():
        secrets = {s["secretName"] for s in spec.get("secretAsEnv", [])}
        assert f"{RELEASE}-hf" in secrets
        (pvc_mount,) = [
            p for p in spec["pvcMount"] if p.get("mountPath", "").endswith("huggingface")
        ]
        assert pvc_mount["mountPath"] == "/home/sparring/.cache/huggingface"


# ---- helm test: KFP and the runner's S3 credentials -------------------------------------------


def serve(handler_cls):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler_cls)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_helm_test_checks_kfp_and_the_runner_secret(tmp_path):
    import base64

    smoke = load_module(CHART / "files" / "smoke_test.py", "smoke_test_runner")
    token = "runner-token"
    seen = []

    class Api(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server API
            seen.append((self.path, self.headers.get("Authorization")))
            if self.path == "/apis/v2beta1/healthz":
                body = {"tag_name": "2.17.0", "multi_user": False}
            elif self.headers.get("Authorization") != f"Bearer {token}":
                self.send_response(403)
                self.end_headers()
                return
            elif self.path == "/api/v1/namespaces/kubeflow/secrets/sparring-s3":
                enc = base64.b64encode(b"x").decode()
                body = {"data": {"AWS_ACCESS_KEY_ID": enc, "AWS_SECRET_ACCESS_KEY": enc}}
            else:
                self.send_response(404)
                self.end_headers()
                return
            self.send_response(200)
            self.end_headers()
            self.wfile.write(json.dumps(body).encode())

        def log_message(self, *args):
            pass

    server = serve(Api)
    api = f"http://127.0.0.1:{server.server_port}"
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text(token)
    keys = ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"]
    try:
        assert smoke.check_kfp(api) == "KFP 2.17.0 multi_user=False"
        assert "sparring-s3" in smoke.check_runner_secret("kubeflow", "sparring-s3", keys, api, sa)
        assert seen[-1][1] == f"Bearer {token}"  # read with the runner's own token
        with pytest.raises(SystemExit, match="cannot read Secret kubeflow/other: HTTP 404"):
            smoke.check_runner_secret("kubeflow", "other", keys, api, sa)
        (sa / "token").write_text("someone-else")
        with pytest.raises(SystemExit, match="HTTP 403"):
            smoke.check_runner_secret("kubeflow", "sparring-s3", keys, api, sa)
        (sa / "token").unlink()
        with pytest.raises(SystemExit, match="no ServiceAccount token"):
            smoke.check_runner_secret("kubeflow", "sparring-s3", keys, api, sa)
    finally:
        server.shutdown()
    with pytest.raises(SystemExit, match="did not answer /apis/v2beta1/healthz"):
        smoke.check_kfp(f"http://127.0.0.1:{_free_port()}", timeout=1)
    web_identity = tmp_path / "aws-token"
    web_identity.write_text("jwt")
    arn = "arn:aws:iam::123456789012:role/sparring"
    env = {"AWS_ROLE_ARN": arn, "AWS_WEB_IDENTITY_TOKEN_FILE": str(web_identity)}
    assert smoke.check_runner_irsa(arn, env) == f"IRSA role {arn}"
    with pytest.raises(SystemExit, match="no IRSA credentials"):
        smoke.check_runner_irsa(arn, {})


@pytest.mark.parametrize("name", ["minimal", "irsa"])
def test_helm_test_pod_is_wired_for_the_runner_checks(chart, name):
    docs = render_named(chart, name)
    pod = by_kind(docs, "Pod")[f"{RELEASE}-test"]
    assert pod["spec"]["serviceAccountName"] == RELEASE
    assert pod["spec"]["automountServiceAccountToken"] is True
    env = {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}
    assert env["KFP_HOST"]["value"] == "http://ml-pipeline.kubeflow.svc.cluster.local:8888"
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    if name == "irsa":
        assert env["RUNNER_S3_SECRET"]["value"] == ""
        assert env["RUNNER_ROLE_ARN"]["value"].startswith("arn:aws:iam::")
    else:
        assert env["RUNNER_S3_SECRET"]["value"] == f"{RELEASE}-s3"


# ---- issue 15: MLflow basic auth, artifacts behind the proxy ----------------------------------

AUTH = {**MINIMAL, "mlflow": {"auth": {"enabled": True, "adminPassword": "pw-for-the-chart-test"}}}


def mlflow_container(docs: list[dict]) -> dict:
    deployment = by_kind(docs, "Deployment")[f"{RELEASE}-mlflow"]
    return next(c for c in deployment["spec"]["template"]["spec"]["containers"])


def test_pipeline_config_registers_behind_the_servers_artifact_proxy(chart):
    """The rendered config's artifacts_destination is the MLflow server's
    --artifacts-destination, so register stores each checkpoint once, in its logged model's
    folder; an external MLflow's destination is unknown (checkpoints stay under runs/)."""
    docs = render(chart, MINIMAL)
    args = mlflow_container(docs)["args"]
    (destination,) = [a.split("=", 1)[1] for a in args if a.startswith("--artifacts-destination")]
    assert pipeline_config(docs)["tracking"]["artifacts_destination"] == destination
    external = {**MINIMAL, "mlflow": {"enabled": False, "externalUrl": "http://mlflow:5000"}}
    assert "artifacts_destination" not in pipeline_config(render(chart, external))["tracking"]


def test_mlflow_auth_runs_the_basic_auth_app_and_every_task_logs_in(chart, tmp_path):
    import base64

    plain = render(chart, MINIMAL)
    assert "--app-name=basic-auth" not in mlflow_container(plain)["args"]
    assert "mlflow_secret" not in pipeline_config(plain)["kubernetes"]

    docs = render(chart, AUTH)
    name = f"{RELEASE}-mlflow-auth"
    container = mlflow_container(docs)
    assert "--app-name=basic-auth" in container["args"]
    env = {e["name"]: e for e in container["env"]}
    refs = {k: env[k]["valueFrom"]["secretKeyRef"] for k in env if "valueFrom" in env[k]}
    assert refs["MLFLOW_AUTH_ADMIN_USERNAME"] == {"name": name, "key": "MLFLOW_TRACKING_USERNAME"}
    assert refs["MLFLOW_AUTH_ADMIN_PASSWORD"] == {"name": name, "key": "MLFLOW_TRACKING_PASSWORD"}
    assert refs["MLFLOW_FLASK_SERVER_SECRET_KEY"]["name"] == name
    login = {
        k: base64.b64decode(v).decode() for k, v in by_kind(docs, "Secret")[name]["data"].items()
    }
    assert (login["MLFLOW_TRACKING_USERNAME"], login["MLFLOW_TRACKING_PASSWORD"]) == (
        "admin",
        "pw-for-the-chart-test",
    )
    assert len(login["MLFLOW_FLASK_SERVER_SECRET_KEY"]) == 32
    # the auth app's config file, its users database on the MLflow volume
    ini = by_kind(docs, "ConfigMap")[name]["data"]["basic_auth.ini"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert f"database_uri = sqlite:///{mounts['db']}/basic_auth.db" in ini
    assert env["MLFLOW_AUTH_CONFIG_PATH"]["value"] == f"{mounts['auth']}/basic_auth.ini"
    # the password is in the Secret only: no other manifest holds it
    others = [d for d in docs if d["kind"] != "Secret"]
    assert "pw-for-the-chart-test" not in yaml.safe_dump_all(others)

    # every pipeline task gets the runner's login (never the admin's) as MLflow's own variables
    runner = f"{RELEASE}-mlflow-runner"
    cfg = pipeline_config(docs)
    assert cfg["kubernetes"]["mlflow_secret"] == runner
    (tmp_path / "pipeline.yaml").write_text(yaml.safe_dump(cfg))
    out = tmp_path / "ir.yaml"
    sparring_cli = str(Path(sys.executable).parent / "sparring")
    cmd = [sparring_cli, "compile", "--config", str(tmp_path / "pipeline.yaml"), "-o", str(out)]
    subprocess.run(cmd, check=True)
    platform = list(yaml.safe_load_all(out.read_text()))[1]["platforms"]["kubernetes"]
    executors = platform["deploymentSpec"]["executors"].values()
    assert executors
    assert name not in out.read_text()
    for spec in executors:
        (secret,) = [s for s in spec["secretAsEnv"] if s["secretName"] == runner]
        assert {(k["secretKey"], k["envVar"]) for k in secret["keyToEnv"]} == {
            ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_USERNAME"),
            ("MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_PASSWORD"),
        }


# ---- issue 34: tasks log in to MLflow as a non-admin runner ---------------------------------


def secrets_used(doc) -> set[str]:
    """Names of the Secrets a manifest reads: env secretKeyRef, envFrom secretRef, volumes."""
    found: set[str] = set()
    if isinstance(doc, dict):
        for key, value in doc.items():
            if key in ("secretKeyRef", "secretRef") and isinstance(value, dict):
                found.add(value["name"])
            elif key == "secret" and isinstance(value, dict) and "secretName" in value:
                found.add(value["secretName"])
            else:
                found |= secrets_used(value)
    elif isinstance(doc, list):
        for value in doc:
            found |= secrets_used(value)
    return found


def test_only_mlflow_and_the_runner_job_hold_the_admin_login(chart):
    """The admin Secret reaches the MLflow server and the Job that creates the runner user;
    pipeline tasks (the rendered config), the registration Jobs and `helm test` never read it.
    The runner's Secret holds another user with a generated password."""
    import base64

    docs = render(chart, AUTH)
    admin, runner = f"{RELEASE}-mlflow-auth", f"{RELEASE}-mlflow-runner"
    readers = {(d["kind"], d["metadata"]["name"]) for d in docs if admin in secrets_used(d)}
    assert readers == {("Deployment", f"{RELEASE}-mlflow"), ("Job", runner)}
    assert pipeline_config(docs)["kubernetes"]["mlflow_secret"] == runner
    login = {
        k: base64.b64decode(v).decode() for k, v in by_kind(docs, "Secret")[runner]["data"].items()
    }
    assert login["MLFLOW_TRACKING_USERNAME"] == "sparring-runner"
    assert len(login["MLFLOW_TRACKING_PASSWORD"]) == 32  # randAlphaNum, kept by lookup
    # a given password, or the user's own Secret
    given = {**MINIMAL, "mlflow": {"auth": {**AUTH_ON, "runner": {"password": "runner-pw-123"}}}}
    data = by_kind(render(chart, given), "Secret")[runner]["data"]
    assert base64.b64decode(data["MLFLOW_TRACKING_PASSWORD"]).decode() == "runner-pw-123"
    own = {**MINIMAL, "mlflow": {"auth": {**AUTH_ON, "runner": {"existingSecret": "my-runner"}}}}
    docs = render(chart, own)
    assert runner not in by_kind(docs, "Secret")
    assert pipeline_config(docs)["kubernetes"]["mlflow_secret"] == "my-runner"
    assert "my-runner" in secrets_used(by_kind(docs, "Job")[runner])
    # no auth: no runner, no login; an external MLflow: the auth Secret is the tasks' login
    plain = render(chart, MINIMAL)
    assert runner not in by_kind(plain, "Job") and runner not in by_kind(plain, "Secret")
    external = {**MINIMAL, "mlflow": {"enabled": False, "externalUrl": "http://m:5000"}}
    external["mlflow"]["auth"] = AUTH_ON
    docs = render(chart, external)
    assert runner not in by_kind(docs, "Job") and runner not in by_kind(docs, "Secret")
    assert pipeline_config(docs)["kubernetes"]["mlflow_secret"] == admin


def test_the_runner_job_creates_the_user_as_admin_on_every_release_before_registration(chart):
    """A hook Job on install, upgrade and rollback (re-created each time: the script is
    idempotent, tests/test_registry.py runs it twice against a real server) that logs in as
    the admin, names the runner from its Secret, and runs the chart's script from the pipeline
    ConfigMap on the MLflow image. It goes before the registration Job, whose recurring run may
    start tasks at once."""
    docs = render(chart, AUTH)
    admin, runner = f"{RELEASE}-mlflow-auth", f"{RELEASE}-mlflow-runner"
    jobs = by_kind(docs, "Job")
    job = jobs[runner]
    hook = job["metadata"]["annotations"]
    assert set(hook["helm.sh/hook"].split(",")) == {"post-install", "post-upgrade", "post-rollback"}
    assert "before-hook-creation" in hook["helm.sh/hook-delete-policy"]
    register = jobs[f"{RELEASE}-register-r1"]["metadata"]["annotations"]
    assert int(hook["helm.sh/hook-weight"]) < int(register["helm.sh/hook-weight"])
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in container["env"] if "valueFrom" in e}
    assert refs == {
        "MLFLOW_TRACKING_USERNAME": {"name": admin, "key": "MLFLOW_TRACKING_USERNAME"},
        "MLFLOW_TRACKING_PASSWORD": {"name": admin, "key": "MLFLOW_TRACKING_PASSWORD"},
        "RUNNER_USERNAME": {"name": runner, "key": "MLFLOW_TRACKING_USERNAME"},
        "RUNNER_PASSWORD": {"name": runner, "key": "MLFLOW_TRACKING_PASSWORD"},
    }
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    cfg = pipeline_config(docs)
    assert env == {
        "MLFLOW_TRACKING_URI": cfg["tracking"]["tracking_uri"],
        "MLFLOW_EXPERIMENT": cfg["tracking"]["experiment"],
        "REGISTERED_MODEL": cfg["registered_model"],
    }
    assert container["image"].endswith("-mlflow")
    validate_strict([job, by_kind(docs, "Secret")[runner]])
    assert restricted_violations(pod) == []
    # the command runs the chart's script, mounted from the pipeline ConfigMap
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    (volume,) = [v for v in pod["volumes"] if v["name"] == "scripts"]
    (item,) = volume["configMap"]["items"]
    assert container["command"] == ["python", f"{mounts['scripts']}/{item['path']}"]
    data = by_kind(docs, "ConfigMap")[volume["configMap"]["name"]]["data"]
    assert data[item["key"]] == (CHART / "files" / "mlflow_runner_user.py").read_text()
    # its pod is one of the release's, which the MLflow NetworkPolicy admits
    labels = job["spec"]["template"]["metadata"]["labels"]
    assert labels["app.kubernetes.io/instance"] == RELEASE


# ---- issue 34: multi-user Kubeflow with Istio sidecars ----------------------------------------

# The AuthorizationPolicy Kubeflow's profile controller puts in every profile namespace
# (kubeflow/dashboard components/profile-controller/controllers/profile_controller.go,
# getAuthorizationPolicy): the owner through the gateway or KFP's UI, mTLS peers of the namespace,
# probe paths, the notebook controller.
NS_OWNER_ACCESS_ISTIO = {
    "apiVersion": "security.istio.io/v1",
    "kind": "AuthorizationPolicy",
    "metadata": {"name": "ns-owner-access-istio", "namespace": "team-a"},
    "spec": {
        "action": "ALLOW",
        "rules": [
            {
                "when": [{"key": "request.headers[kubeflow-userid]", "values": ["a@x.org"]}],
                "from": [
                    {
                        "source": {
                            "principals": [
                                "cluster.local/ns/istio-system/sa/istio-ingressgateway-service-account",
                                "cluster.local/ns/kubeflow/sa/ml-pipeline-ui",
                            ]
                        }
                    }
                ],
            },
            {"when": [{"key": "source.namespace", "values": ["team-a"]}]},
            {"to": [{"operation": {"paths": ["/healthz", "/metrics", "/wait-for-drain"]}}]},
            {
                "from": [
                    {
                        "source": {
                            "principals": [
                                "cluster.local/ns/kubeflow/sa/notebook-controller-service-account"
                            ]
                        }
                    }
                ],
                "to": [{"operation": {"methods": ["GET"], "paths": ["*/api/kernels"]}}],
            },
        ],
    },
}


def _matches(values: list[str], value: str | None) -> bool:
    """Istio's string match: exact, `prefix*`, `*suffix` or `*`; nothing matches a missing
    value (a plain-text peer has no principal and no source namespace)."""
    if value is None:
        return False
    return any(
        v == "*"
        or v == value
        or (v.endswith("*") and value.startswith(v[:-1]))
        or (v.startswith("*") and value.endswith(v[1:]))
        for v in values
    )


def _rule_matches(rule: dict, request: dict) -> bool:
    """One ALLOW rule against a request: every field set must match (Istio's semantics for the
    fields these policies use; any other field fails the test rather than being ignored)."""
    fields = {
        "principals": request.get("principal"),
        "namespaces": request.get("namespace"),
        "ports": str(request["port"]),
        "paths": request["path"],
        "methods": request["method"],
    }
    for part, key in (("from", "source"), ("to", "operation")):
        if part in rule and not any(
            all(_matches(vals, fields[f]) for f, vals in entry[key].items()) for entry in rule[part]
        ):
            return False
    conditions = {"source.namespace": request.get("namespace")}
    conditions |= {f"request.headers[{h}]": v for h, v in request.get("headers", {}).items()}
    return all(_matches(c["values"], conditions.get(c["key"])) for c in rule.get("when", []))


def istio_allows(policies: list[dict], pod_labels: dict, request: dict) -> bool:
    """Istio's decision for a pod with ALLOW policies only: with none selecting the pod,
    allow; else allow when a rule of one of them matches."""
    selecting = [
        p
        for p in policies
        if p["spec"]["action"] == "ALLOW"
        and p["spec"].get("selector", {}).get("matchLabels", {}).items() <= pod_labels.items()
    ]
    return not selecting or any(
        _rule_matches(rule, request) for p in selecting for rule in p["spec"]["rules"]
    )


def pod_labels(docs: list[dict], kind: str, name: str) -> dict:
    doc = by_kind(docs, kind)[name]
    return (doc["spec"]["template"]["metadata"] if kind != "Pod" else doc["metadata"])["labels"]


# A task's MLflow call: KFP v2 starts run pods without a sidecar (the API server annotates every
# template `sidecar.istio.io/inject: "false"`, v2_template.go), so the server sees plain text:
# no principal, no source namespace.
RUN_POD_CALL = {"port": 5000, "path": "/api/2.0/mlflow/runs/create", "method": "POST"}


def test_multi_user_istio_admits_sidecarless_run_pods_to_mlflow_and_s3(chart):
    values = {**values_for("multi-user"), "seaweedfs": {"enabled": True}}
    values["s3"] = {**MINIMAL["s3"], "bucket": "team-a-sparring"}
    docs = render(chart, values, namespace="team-a")
    validate_strict(docs)
    ours = list(by_kind(docs, "AuthorizationPolicy").values())
    mlflow = pod_labels(docs, "Deployment", f"{RELEASE}-mlflow")
    s3 = pod_labels(docs, "Deployment", f"{RELEASE}-s3")
    s3_call = {**RUN_POD_CALL, "port": 8333, "path": "/team-a-sparring/x", "method": "PUT"}
    # before: the profile's policy alone refuses the run pods (the reported 403s)
    assert not istio_allows([NS_OWNER_ACCESS_ISTIO], mlflow, RUN_POD_CALL)
    assert not istio_allows([NS_OWNER_ACCESS_ISTIO], s3, s3_call)
    # after: the chart's policies admit them, each on its own server's port only
    everything = [NS_OWNER_ACCESS_ISTIO, *ours]
    assert istio_allows(everything, mlflow, RUN_POD_CALL)
    assert istio_allows(everything, s3, s3_call)
    assert not istio_allows(everything, mlflow, {**RUN_POD_CALL, "port": 8333})
    assert not istio_allows(everything, s3, {**s3_call, "port": 5000})
    # mTLS peers of the namespace (MLflow's own sidecar calling S3) still pass
    assert istio_allows(everything, s3, {**s3_call, "namespace": "team-a"})
    # each policy selects its server's pods and no other pod of the release
    for policy in ours:
        selector = policy["spec"]["selector"]["matchLabels"].items()
        chosen = [
            name
            for kind in ("Deployment", "Job", "Pod")
            for name in by_kind(docs, kind)
            if selector <= pod_labels(docs, kind, name).items()
        ]
        assert chosen == [policy["metadata"]["name"]]
    # the same pods accept plain text even where the mesh enforces STRICT mTLS
    peer = by_kind(docs, "PeerAuthentication")
    assert set(peer) == {f"{RELEASE}-mlflow", f"{RELEASE}-s3"}
    for name, doc in peer.items():
        assert doc["spec"]["mtls"] == {"mode": "PERMISSIVE"}
        assert (
            doc["spec"]["selector"]
            == by_kind(docs, "AuthorizationPolicy")[name]["spec"]["selector"]
        )
    # the callers stay the NetworkPolicy's: pipeline pods, KFP's UI and the release
    assert set(by_kind(docs, "NetworkPolicy")) >= set(peer)


def test_helm_test_passes_in_a_sidecar_injected_profile(chart):
    """`helm test`'s Pod has no sidecar (it must exit), so it too calls MLflow in plain text,
    on the path smoke_test.py checks."""
    docs = render_named(chart, "multi-user")
    test_pod = pod_labels(docs, "Pod", f"{RELEASE}-test")
    assert test_pod["sidecar.istio.io/inject"] == "false"
    mlflow = pod_labels(docs, "Deployment", f"{RELEASE}-mlflow")
    health = {"port": 5000, "path": "/health", "method": "GET"}
    policies = [NS_OWNER_ACCESS_ISTIO, *by_kind(docs, "AuthorizationPolicy").values()]
    assert istio_allows(policies, mlflow, health)
    assert not istio_allows([NS_OWNER_ACCESS_ISTIO], mlflow, health)
    assert '/health")' in (CHART / "files" / "smoke_test.py").read_text()  # what it GETs


def test_istio_policies_only_with_istio_and_a_network_policy(chart):
    assert not {"AuthorizationPolicy", "PeerAuthentication"} & {
        d["kind"] for d in render(chart, MINIMAL)
    }
    with pytest.raises(Exception, match="set networkPolicy.enabled=true"):
        render(chart, {**MINIMAL, "istio": {"enabled": True}, "networkPolicy": {"enabled": False}})
    policy = by_kind(render_named(chart, "multi-user"), "AuthorizationPolicy")[f"{RELEASE}-mlflow"]
    policy["spec"]["rules"][0]["to"][0]["operation"]["port"] = ["5000"]  # a typo Istio refuses
    with pytest.raises(jsonschema.ValidationError):
        validate_strict([policy])


def test_ray_pods_take_connections_only_from_ray_pods_and_the_operator(chart):
    from sparring.verl_backend.rayjob import RAY_POD_LABELS

    docs = render(chart, {**MINIMAL, "networkPolicy": {"kubeRayNamespace": "ray-system"}})
    policy = by_kind(docs, "NetworkPolicy")[f"{RELEASE}-ray"]["spec"]
    assert policy["podSelector"]["matchLabels"].items() <= RAY_POD_LABELS.items()
    ray, operator = policy["ingress"]
    assert ray == {"from": [{"podSelector": policy["podSelector"]}]}  # no port: Ray uses many
    assert operator["ports"] == [{"port": 8265, "protocol": "TCP"}]  # the dashboard's job API
    assert operator["from"] == [
        {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ray-system"}},
            "podSelector": {"matchLabels": {"app.kubernetes.io/component": "kuberay-operator"}},
        }
    ]
    for off in ({"networkPolicy": {"ray": False}}, {"rbac": {"rayJobs": False}}):
        assert f"{RELEASE}-ray" not in by_kind(render(chart, {**MINIMAL, **off}), "NetworkPolicy")


def test_registry_consumers_get_through_to_mlflow_and_s3_only_when_listed(chart):
    """networkPolicy.consumers (notebooks, KServe) joins the peers of both servers' policies,
    MLflow's and the bundled S3's, and nothing else changes; without MLflow auth the notes warn."""
    notebooks = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "team-a"}},
        "podSelector": {"matchExpressions": [{"key": "notebook-name", "operator": "Exists"}]},
    }
    kserve = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "serving"}},
        "podSelector": {
            "matchExpressions": [
                {"key": "serving.kserve.io/inferenceservice", "operator": "Exists"}
            ]
        },
    }
    base = values_for("local")
    plain = by_kind(render(chart, base), "NetworkPolicy")
    values = copy.deepcopy(base)
    values.setdefault("networkPolicy", {})["consumers"] = [notebooks, kserve]
    docs = render(chart, values)
    opened = by_kind(docs, "NetworkPolicy")
    validate_strict(docs)
    for component in ("mlflow", "s3"):
        name = f"{RELEASE}-{component}"
        before = plain[name]["spec"]["ingress"][0]["from"]
        assert opened[name]["spec"]["ingress"][0]["from"] == [*before, notebooks, kserve]
        assert (
            opened[name]["spec"]["ingress"][0]["ports"]
            == plain[name]["spec"]["ingress"][0]["ports"]
        )
    assert opened[f"{RELEASE}-ray"] == plain[f"{RELEASE}-ray"]
    notes = chart.render(values, name=RELEASE, namespace=NAMESPACE)["sparring/templates/NOTES.txt"]
    assert "WARNING: networkPolicy.consumers" in notes
    auth = copy.deepcopy(values)
    auth.setdefault("mlflow", {})["auth"] = {
        "enabled": True,
        "adminPassword": "a-long-password-123",
    }
    notes = chart.render(auth, name=RELEASE, namespace=NAMESPACE)["sparring/templates/NOTES.txt"]
    assert "WARNING: networkPolicy.consumers" not in notes
    with pytest.raises(Exception, match="consumers"):  # a peer is a selector, not anything
        render(chart, {**base, "networkPolicy": {"consumers": [{"pods": "all"}]}})


@pytest.mark.parametrize(
    ("name", "extra", "secrets"),
    [
        ("minimal", [], [f"{RELEASE}-s3"]),
        ("existing", [], ["my-s3"]),  # a Secret you manage, by its name
        ("minimal", ["theirs", f"{RELEASE}-s3"], [f"{RELEASE}-s3", "theirs"]),
        ("irsa", [], []),  # no keys: no Secret to read, and no rule (which would mean all)
        ("irsa", ["mlpipeline-minio-artifact"], ["mlpipeline-minio-artifact"]),
    ],
)
def test_the_runner_reads_only_the_secrets_it_names(chart, name, extra, secrets):
    """The runner Role may `get` the S3 Secret KFP's launcher reads and rbac.extraSecrets, by
    name; no rule grants Secrets without resourceNames (every Secret of the namespace), and the
    MLflow login and HF token reach tasks as env (kubelet), not through the Role."""
    values = copy.deepcopy(values_for("minimal" if name == "existing" else name))
    values.setdefault("rbac", {})["extraSecrets"] = extra
    if name == "existing":
        values["s3"]["credentials"] = {"mode": "existingSecret", "existingSecret": "my-s3"}
    docs = render(chart, values, namespace=NAMESPACES.get(name, NAMESPACE))
    role = by_kind(docs, "Role")[f"{RELEASE}-runner"]
    core = [r for r in role["rules"] if "" in r["apiGroups"]]
    rules = [r for r in core if {"secrets", "*"} & set(r["resources"])]
    assert [r["resourceNames"] for r in rules] == ([secrets] if secrets else [])
    assert all(r["verbs"] == ["get"] and r["apiGroups"] == [""] for r in rules)
    assert not any("*" in r["resources"] and "" in r["apiGroups"] for r in role["rules"])
    validate_strict(docs)


def test_pipeline_uid_and_gid_can_be_left_to_openshift(chart, tmp_path):
    """pipeline.runAsUser/runAsGroup: null (OpenShift's restricted-v2 SCC) render as null in
    the pipeline config, which compiles without a uid/gid; the default stays 10001:0."""
    from sparring.loop.config import PipelineConfig

    default = pipeline_config(render(chart, MINIMAL))["kubernetes"]
    assert (default["run_as_user"], default["run_as_group"]) == (10001, 0)
    values = copy.deepcopy(MINIMAL)
    values["pipeline"] = {"runAsUser": None, "runAsGroup": None}
    rendered = pipeline_config(render(chart, values))
    assert (rendered["kubernetes"]["run_as_user"], rendered["kubernetes"]["run_as_group"]) == (
        None,
        None,
    )
    cfg = PipelineConfig.model_validate(rendered)
    assert cfg.kubernetes.run_as_user is None and cfg.kubernetes.run_as_group is None
    with pytest.raises(Exception, match="runAsUser"):
        render(chart, {**MINIMAL, "pipeline": {"runAsUser": 0}})
