"""The Helm chart, offline: lint, render with realistic values files, validate every manifest
with kubernetes-validate (strict), invalid combinations, the pipeline config, and the chart's
scripts (registration against a fake KFP client, the dev S3 server against a real `weed`).

There is no helm binary, API server or cluster here: helm-python-sdk renders the chart.
"""

from __future__ import annotations

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
}


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


def render(chart: Chart, values: dict, revision: int = 1) -> list[dict]:
    """Every manifest the chart renders (hooks and tests included), parsed."""
    out = chart.render(values, name=RELEASE, namespace=NAMESPACE, revision=revision)
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


def pipeline_config(docs: list[dict]) -> dict:
    return yaml.safe_load(
        by_kind(docs, "ConfigMap")[f"{RELEASE}-pipeline"]["data"]["pipeline.yaml"]
    )


# ---- lint, schema, validation --------------------------------------------------------------


def test_chart_metadata_tracks_project_version():
    meta = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert meta["appVersion"] == sparring.__version__
    assert meta["apiVersion"] == "v2"


@pytest.mark.parametrize("name", list(VALUES_FILES))
def test_lint_passes(name):
    report = lint(str(CHART), values_for(name), strict=True, kube_version=f"v{KUBE_VERSION}")
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


@pytest.mark.parametrize("name", list(VALUES_FILES))
def test_manifests_are_valid_kubernetes(chart, name):
    docs = render(chart, values_for(name))
    assert len(docs) >= 8
    for doc in docs:
        # raises ValidationError on unknown fields (strict) or wrong types
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)


@pytest.mark.parametrize("name", list(VALUES_FILES))
def test_every_pod_is_hardened_and_uses_our_images(chart, name):
    values = values_for(name)
    docs = render(chart, values)
    repo = values.get("image", {}).get("repository", "ghcr.io/sparring/sparring")
    cpu_ref = build_sh_refs("--repository", repo, "--only", "cpu")[0]
    specs = pod_specs(docs)
    assert specs
    for spec in specs:
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["runAsUser"] != 0
        for c in spec["containers"]:
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False
            assert sc["readOnlyRootFilesystem"] is True
            assert sc["capabilities"]["drop"] == ["ALL"]
            assert c["resources"]["requests"] and c["resources"]["limits"]["memory"]
            assert c["image"] == cpu_ref
            # a read-only root needs a writable /tmp
            assert "/tmp" in {m["mountPath"] for m in c["volumeMounts"]}


def test_default_install_pieces(chart):
    docs = render(chart, MINIMAL)
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == sorted(
        ["ServiceAccount", "Role", "RoleBinding", "Secret", "ConfigMap", "ConfigMap"]
        + ["Deployment", "Service", "PersistentVolumeClaim", "Job", "Pod"]
    )
    mlflow = by_kind(docs, "Deployment")[f"{RELEASE}-mlflow"]
    args = mlflow["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--artifacts-destination=s3://sparring-min/sparring/mlflow" in args
    assert any(a.startswith("--allowed-hosts=sparring-mlflow,") for a in args)
    probe = mlflow["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]
    assert probe["path"] == "/health"
    job = by_kind(docs, "Job")[f"{RELEASE}-register-r1"]
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "post-install,post-upgrade"
    test_pod = by_kind(docs, "Pod")[f"{RELEASE}-test"]
    assert test_pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    # least privilege: get only, on named resources only
    role = by_kind(docs, "Role")[RELEASE]
    for rule in role["rules"]:
        assert rule["verbs"] == ["get"] and rule["resourceNames"]
    launcher = by_kind(docs, "ConfigMap")["kfp-launcher"]["data"]
    assert launcher["defaultPipelineRoot"] == "s3://sparring-min/sparring/kfp"
    providers = yaml.safe_load(launcher["providers"])["s3"]["default"]
    assert providers["credentials"]["secretRef"]["secretName"] == f"{RELEASE}-s3"


def test_irsa_has_no_keys_and_annotates_the_service_account(chart):
    docs = render(chart, values_for("irsa"))
    assert "Secret" not in {d["kind"] for d in docs}
    sa = by_kind(docs, "ServiceAccount")[RELEASE]
    assert sa["metadata"]["annotations"]["eks.amazonaws.com/role-arn"].startswith("arn:aws:iam::")
    providers = yaml.safe_load(by_kind(docs, "ConfigMap")["kfp-launcher"]["data"]["providers"])
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
    providers = yaml.safe_load(by_kind(docs, "ConfigMap")["kfp-launcher"]["data"]["providers"])
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


def test_external_values_use_postgres_pull_secrets_and_projected_token(chart):
    docs = render(chart, values_for("external"))
    assert "kfp-launcher" not in by_kind(docs, "ConfigMap")
    assert "PersistentVolumeClaim" not in {d["kind"] for d in docs}
    mlflow = by_kind(docs, "Deployment")[f"{RELEASE}-mlflow"]["spec"]["template"]["spec"]
    db = next(e for e in mlflow["containers"][0]["env"] if e["name"] == "MLFLOW_BACKEND_STORE_URI")
    assert db["valueFrom"]["secretKeyRef"] == {"name": "mlflow-postgres", "key": "uri"}
    assert mlflow["imagePullSecrets"] == [{"name": "regcred"}]
    job = by_kind(docs, "Job")[f"{RELEASE}-register-r1"]["spec"]["template"]["spec"]
    token = next(v for v in job["volumes"] if v["name"] == "kfp-token")
    assert (
        token["projected"]["sources"][0]["serviceAccountToken"]["audience"]
        == "pipelines.kubeflow.org"
    )
    assert job["containers"][0]["image"] == "registry.example.com/ml/sparring:0.1.0-cpu"


# ---- invalid values ------------------------------------------------------------------------

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
        {
            **MINIMAL,
            "pipeline": {"register": {"enabled": False, "recurringRun": {"enabled": True}}},
        },
        "needs pipeline.register.enabled",
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
    assert env["PIPELINE_VERSION"] == f"{sparring.__version__}-r1"


def test_upgrade_registers_a_new_version(chart):
    docs = render(chart, values_for("gpu"), revision=7)
    job = by_kind(docs, "Job")[f"{RELEASE}-register-r7"]["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in job["containers"][0]["env"]}
    assert env["PIPELINE_VERSION"] == f"{sparring.__version__}-r7"
    assert env["RECURRING_RUN_CRON"] == "0 0 2 * * *"


def _pipeline_config_importable() -> bool:
    try:
        import sparring.pipeline.config  # noqa: F401
    except ImportError:
        return False
    return True


needs_pipeline = pytest.mark.skipif(
    not _pipeline_config_importable(),
    reason="sparring.pipeline.config (issue 4) does not import yet",
)


@needs_pipeline
@pytest.mark.parametrize("name", list(VALUES_FILES))
def test_rendered_config_is_a_valid_pipeline_config(chart, name):
    from sparring.pipeline.config import GPU_IMAGE, IMAGE, PipelineConfig

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
    """Records calls; pipelines/versions/recurring runs live in dicts."""

    def __init__(self, pipelines=None, versions=None, recurring=None):
        self.pipelines = dict(pipelines or {})  # name -> id
        self.versions = dict(versions or {})  # (pipeline id, version name) -> id
        self.recurring = dict(recurring or {})  # id -> name
        self.calls: list[str] = []

    def get_pipeline_id(self, name):
        return self.pipelines.get(name)

    def upload_pipeline(self, package, pipeline_name, description):
        self.calls.append("upload_pipeline")
        pid = f"p-{pipeline_name}"
        self.pipelines[pipeline_name] = pid
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

    def create_experiment(self, name, namespace=None):
        return SimpleNamespace(experiment_id=f"e-{name}")

    def list_recurring_runs(self, experiment_id, page_size):
        runs = [
            SimpleNamespace(recurring_run_id=i, display_name=n) for i, n in self.recurring.items()
        ]
        return SimpleNamespace(recurring_runs=runs or None)

    def delete_recurring_run(self, rid):
        self.calls.append(f"delete {rid}")
        del self.recurring[rid]

    def create_recurring_run(self, experiment_id, job_name, **kw):
        self.calls.append(f"create_recurring_run {kw['version_id']} {kw['cron_expression']}")
        self.recurring[f"r{len(self.calls)}"] = job_name
        return SimpleNamespace(recurring_run_id=f"r{len(self.calls)}")


@pytest.fixture()
def register():
    return load_module(CHART / "files" / "register_pipeline.py", "register_pipeline")


def test_register_creates_then_versions_then_is_idempotent(register, chart, monkeypatch):
    compiled = []
    monkeypatch.setattr(register, "compile_pipeline", lambda cfg, pkg: compiled.append((cfg, pkg)))
    docs = render(chart, values_for("gpu"), revision=2)
    job = by_kind(docs, "Job")[f"{RELEASE}-register-r2"]["spec"]["template"]["spec"]
    env = {e["name"]: e["value"] for e in job["containers"][0]["env"]}  # the Job's real env

    client = FakeKfp()
    assert register.main(env, client) == 0
    assert compiled == [("/etc/sparring/pipeline.yaml", "/tmp/pipeline-ir.yaml")]
    assert client.calls[0] == "upload_pipeline"
    assert client.calls[1] == "create_recurring_run v-first 0 0 2 * * *"

    existing = FakeKfp(
        pipelines={"sparring-selfplay": "p1"},
        recurring={"old": "sparring-selfplay-recurring", "x": "other"},
    )
    register.main(env, existing)
    assert existing.calls == [
        "upload_pipeline_version",
        "delete old",
        "create_recurring_run v-0.1.0-r2 0 0 2 * * *".replace("0.1.0", sparring.__version__),
    ]
    assert "x" in existing.recurring  # other recurring runs are left alone
    existing.calls.clear()
    register.main({k: v for k, v in env.items() if not k.startswith("RECURRING")}, existing)
    assert existing.calls == []  # a retried Job does not upload the same version twice


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
