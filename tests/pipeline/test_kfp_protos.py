"""Every shipped pipeline config, compiled for each KFP backend it may target, parses STRICTLY
with that backend's protos, as the backend parses it (read from kubeflow/pipelines 2.16.0 and
2.17.0):

- the API server (apiserver/template/v2_template.go) unmarshals the pipeline spec and the
  platform spec with protojson, unknown fields rejected; a platform spec that fails is not an
  error but silently dropped (IsPlatformSpecWithKubernetesConfig), with every Secret, GPU
  node selector, toleration, volume, timeout and security context in it;
- the Argo compiler and the driver (argocompiler/container.go, cmd/driver/main.go) unmarshal
  each executor's KubernetesExecutorConfig the same way.

The protos are those of the kfp-pipeline-spec and kfp-kubernetes releases: 2.17 from the dev
venv (the locked SDK), 2.16.1 pip-installed from PyPI into a throwaway folder (once per module).
Each parse runs in a subprocess, since both releases register the same proto names.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import kfp
import pytest
import yaml
from package_index import index_reachable
from sparring.pipelines.selfplay import compile_pipeline

from sparring.loop.config import CONFIG_DIR, PipelineConfig

NOT_PIPELINES = ("train.yaml", "sft.yaml", "sft-average.yaml")  # the trainers' configs
SHIPPED = sorted(p for p in CONFIG_DIR.rglob("*.yaml") if p.name not in NOT_PIPELINES)
TARGETS = ("2.16", "2.17")  # kubernetes.kfp_version
AVERAGED = "kuhn-smollm2.yaml"  # also compiled with `average`: its three tasks parse too
PROTOS_2_16 = ("kfp-pipeline-spec==2.16.1", "kfp-kubernetes==2.16.1")

# Runs with `root` holding kfp/pipeline_spec and kfp/kubernetes of one release: only their
# generated modules are loaded (kfp/__init__ and kfp/kubernetes/__init__ import the SDK).
PARSE = """
import json, sys, types
from pathlib import Path
root, files = Path(sys.argv[1]), sys.argv[2:]
for name in ("kfp", "kfp.kubernetes"):
    package = types.ModuleType(name)
    package.__path__ = [str(root / name.replace(".", "/"))]
    sys.modules[name] = package
import yaml
from google.protobuf import json_format
from kfp.kubernetes import kubernetes_executor_config_pb2 as k8s
from kfp.pipeline_spec import pipeline_spec_pb2 as ps

def errors(doc, message):
    try:
        json_format.ParseDict(json.loads(json.dumps(doc)), message, ignore_unknown_fields=False)
    except json_format.ParseError as e:
        return [str(e).splitlines()[0]]
    return []

report = {"protos": ps.__file__, "files": {}}
for path in files:
    spec, platform = yaml.safe_load_all(Path(path).read_text())
    found = errors(spec, ps.PipelineSpec()) + errors(platform, ps.PlatformSpec())
    executors = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    for label, config in executors.items():
        found += [f"{label}: {e}" for e in errors(config, k8s.KubernetesExecutorConfig())]
    report["files"][path] = {"errors": found, "executors": len(executors)}
print(json.dumps(report))
"""


@pytest.fixture(scope="module")
def protos(tmp_path_factory) -> dict[str, Path]:
    """{release: the folder holding its kfp/pipeline_spec and kfp/kubernetes}."""
    venv = Path(kfp.__file__).parents[1]  # the locked 2.17 SDK
    if not index_reachable():
        if os.environ.get("CI"):
            pytest.fail("installing the KFP 2.16 protos needs the package index (PyPI)")
        pytest.skip(f"installing {PROTOS_2_16} needs PyPI, which is unreachable")
    target = tmp_path_factory.mktemp("kfp-2.16-protos")
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    cmd += ["--no-deps", "--target", str(target), *PROTOS_2_16]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return {"2.16": target, "2.17": venv}


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> dict[tuple[str, str], Path]:
    """{(config file, target): its compiled IR}, 2 unrolled iterations each (every kfp call
    of a longer run is one of these); `AVERAGED` once more with `average` set."""
    out = tmp_path_factory.mktemp("ir")
    irs = {}
    variants = [(p.name, PipelineConfig.from_yaml(p)) for p in SHIPPED]
    averaged = PipelineConfig.from_yaml(CONFIG_DIR / AVERAGED).model_dump(exclude_unset=True)
    variants += [(f"{AVERAGED}+average", PipelineConfig.model_validate(averaged | {"average": {}}))]
    for name, cfg in variants:
        cfg = cfg.model_copy(update={"iterations": 2})
        for target in TARGETS:
            k8s = cfg.kubernetes.model_copy(update={"kfp_version": target})
            ir = out / f"{name}-{target}.yaml"
            irs[name, target] = Path(
                compile_pipeline(cfg.model_copy(update={"kubernetes": k8s}), str(ir))
            )
    return irs


def parse(root: Path, files: list[Path]) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", PARSE, str(root), *map(str, files)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert Path(report["protos"]).is_relative_to(root)  # that release's protos, not the venv's
    return report["files"]


@pytest.mark.parametrize("release", ["2.16", "2.17"])
def test_what_targets_a_release_parses_strictly_with_its_protos(release, protos, compiled):
    """An IR for 2.16 parses with the 2.16 and the 2.17 protos (2.17 reads 2.16's fields);
    one for 2.17 with 2.17's. Every executor has its Kubernetes config."""
    files = {k: v for k, v in compiled.items() if k[1] == "2.16" or release == "2.17"}
    report = parse(protos[release], list(files.values()))
    assert len(report) == (len(SHIPPED) + 1) * (1 if release == "2.16" else 2)
    for (config, target), ir in files.items():
        assert report[str(ir)]["errors"] == [], f"{config} for KFP {target}"
        assert report[str(ir)]["executors"] > 0, config


def test_the_2_17_run_deadline_is_what_a_2_16_api_server_cannot_parse(protos, compiled):
    """The bug a 2.16 target avoids: the 2.17 IR's pipelineConfig.activeDeadlineSeconds is the
    only thing the 2.16 protos reject, so a 2.16 API server would drop the whole platform spec.
    Both targets' IRs hold the same executors' Kubernetes configs."""
    files = [ir for (_, target), ir in compiled.items() if target == "2.17"]
    report = parse(protos["2.16"], files)
    for ir in files:
        (error,) = report[str(ir)]["errors"]
        assert "no field named" in error and '"activeDeadlineSeconds"' in error, error
    for path in SHIPPED:
        old, new = (list(yaml.safe_load_all(compiled[path.name, t].read_text())) for t in TARGETS)
        cfg = PipelineConfig.from_yaml(path).kubernetes
        config = new[1]["platforms"]["kubernetes"].pop("pipelineConfig")
        assert config == {"activeDeadlineSeconds": cfg.run_deadline_seconds}
        assert new[1] == old[1] and "pipelineConfig" not in old[1]["platforms"]["kubernetes"]
