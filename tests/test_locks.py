"""The images' lock files (images/requirements-<image>.lock, written by images/lock.py).

Offline: every pin is exact and hashed, the project's own requirements accept the locked
versions, the installed packages' declared requirements hold in each lock, and only the
`-diplomacy` locks hold the AGPL engine, and every lock's kfp and kfp-kubernetes meet the range
pyproject.toml declares. Online (PyPI): images/lock.py --check re-resolves every lock for its
image's platform and Python and must reproduce it; a lock that does not resolve fails. And the
locked KFP SDK, installed from the index into a throwaway folder, compiles the shipped configs.
Those tests need the index: they run wherever PyPI answers and are never skipped in CI.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tomllib
import warnings
from pathlib import Path

import pytest
import yaml
from package_index import index_reachable
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def load_lock_module():
    spec = importlib.util.spec_from_file_location("images_lock", ROOT / "images" / "lock.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


LOCK = load_lock_module()
ALL_NAMES = list(LOCK.IMAGES_BY_NAME)
# The runtime images, built on the project (the MLflow server image is standalone).
NAMES = [n for n in ALL_NAMES if not LOCK.IMAGES_BY_NAME[n].standalone]


def pins(name: str) -> dict[str, tuple[str, frozenset[str]]]:
    return LOCK.parse_lock(LOCK.IMAGES_BY_NAME[name].lock.read_text())


def image_env(image) -> dict[str, str]:
    """PEP 508 marker environment of the image: Linux x86_64, CPython 3.11."""
    env = default_environment()
    env.update(
        sys_platform="linux",
        platform_system="Linux",
        platform_machine="x86_64",
        os_name="posix",
        python_version="3.11",
        python_full_version="3.11.13",
        implementation_name="cpython",
        platform_python_implementation="CPython",
    )
    return env


def unmet(requirements: list[str], lock: dict, env: dict, extras=("",)) -> list[str]:
    """Requirements (whose markers apply in `env`) that the lock's versions do not satisfy."""
    bad = []
    for text in requirements:
        req = Requirement(text)
        if req.marker and not any(req.marker.evaluate({**env, "extra": e}) for e in extras):
            continue
        name = canonicalize_name(req.name)
        if name not in lock:
            bad.append(f"{text}: not in the lock")
        elif not req.specifier.contains(lock[name][0], prereleases=True):
            bad.append(f"{text}: lock has {lock[name][0]}")
    return bad


@pytest.mark.parametrize("name", ALL_NAMES)
def test_every_pin_is_exact_and_hashed(name):
    image = LOCK.IMAGES_BY_NAME[name]
    text = image.lock.read_text()
    assert text.startswith(LOCK.header(image))
    lock = pins(name)
    assert len(lock) > 50
    for pkg, (version, hashes) in lock.items():
        assert hashes, f"{pkg}=={version} has no --hash"
    body = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    for line in body:
        assert LOCK.REQ.match(line) or line.strip().startswith("--hash=sha256:"), line
    assert not any(line.startswith(("-e", "--")) or "://" in line for line in body)


@pytest.mark.parametrize("name", NAMES)
def test_the_project_accepts_the_locked_stack(name):
    """pyproject.toml's dependencies (torch, transformers, verl, ...) and the image extras
    (gguf, textarena) hold in every image; the AGPL extra only in the -diplomacy ones."""
    lock = pins(name)
    env = image_env(LOCK.IMAGES_BY_NAME[name])
    assert unmet(PYPROJECT["project"]["dependencies"], lock, env) == []
    extras = PYPROJECT["project"]["optional-dependencies"]
    if name.endswith("-diplomacy"):
        assert unmet(extras["diplomacy"], lock, env) == []
    # every image converts the named real models (gguf) and plays TextArena's games
    assert set(LOCK.EXTRAS) == {"gguf", "textarena"}
    for extra in LOCK.EXTRAS:
        assert extras[extra] and unmet(extras[extra], lock, env) == [], extra


@pytest.mark.parametrize("name", NAMES)
def test_installed_packages_requirements_hold_in_the_lock(name):
    """Offline cross-check with real metadata: every package installed here at the locked
    version (verl, transformers, mlflow, kfp, ...) has its requirements met by the lock."""
    lock = pins(name)
    env = image_env(LOCK.IMAGES_BY_NAME[name])
    checked = 0
    for pkg, (version, _) in lock.items():
        try:
            dist = importlib.metadata.distribution(pkg)
        except importlib.metadata.PackageNotFoundError:
            continue
        if dist.version != version:
            continue
        assert unmet(dist.requires or [], lock, env) == [], f"{pkg}=={version}"
        checked += 1
    assert checked >= 40, "most of the lock is installed in the dev venv at the same version"


def test_the_mlflow_image_is_the_clients_mlflow_without_the_training_stack():
    """The chart's MLflow server (images/Dockerfile.mlflow) runs the MLflow the pipeline's
    clients run, with its basic-auth app, S3 and Postgres, and none of the training stack."""
    server, cpu = pins("mlflow"), pins("cpu")
    assert server["mlflow"][0] == cpu["mlflow"][0]
    assert LOCK.declared("mlflow") == f"mlflow=={server['mlflow'][0]}"  # pyproject.toml's pin
    assert {"flask-wtf", "boto3", "psycopg2-binary", "mlflow-skinny"} <= set(server)
    heavy = {"torch", "transformers", "verl", "kfp", "accelerate", "sparring", "triton"}
    assert not heavy & set(server) and not any(p.startswith("nvidia-") for p in server)
    assert len(server) < len(cpu) / 2
    shared = set(server) & set(cpu)
    assert {p: server[p][0] for p in shared} == {p: cpu[p][0] for p in shared}
    env = image_env(LOCK.IMAGES_BY_NAME["mlflow"])
    for pkg, (version, _) in server.items():  # what is installed here at the locked version
        try:
            dist = importlib.metadata.distribution(pkg)
        except importlib.metadata.PackageNotFoundError:
            continue
        if dist.version == version:
            assert unmet(dist.requires or [], server, env, extras=("", "auth")) == [], pkg


def test_gpu_stack_is_one_coherent_release_set():
    gpu = pins("gpu")
    assert gpu["verl"][0] == "0.9.1" and gpu["sglang"][0] == "0.5.13"
    assert gpu["torch"][0] == "2.11.0" and gpu["transformers"][0] == "5.8.1"
    # verl 0.9.1 excludes the transformers sglang 0.5.12 pins; the locked one is in its range
    verl = importlib.metadata.distribution("verl")
    assert verl.version == gpu["verl"][0]
    (spec,) = [r for r in verl.requires if Requirement(r).name == "transformers" and ";" not in r]
    assert Requirement(spec).specifier.contains(gpu["transformers"][0])
    assert not Requirement(spec).specifier.contains("5.6.0")
    cpu = pins("cpu")
    assert cpu["torch"][0] == "2.13.0+cpu"
    assert not any(p.startswith("nvidia-") for p in cpu), "the CPU image pulls no CUDA wheels"


@pytest.mark.parametrize("base", ["cpu", "gpu"])
def test_only_the_diplomacy_locks_hold_the_agpl_engine(base):
    plain, agpl = pins(base), pins(f"{base}-diplomacy")
    assert "diplomacy" not in plain
    assert agpl["diplomacy"][0] == "1.1.2"
    # the flavour adds packages and changes none of the base image's
    assert {p: v for p, (v, _) in plain.items()} == {p: agpl[p][0] for p in plain}, (
        "the -diplomacy lock keeps the base pins"
    )
    assert set(agpl) - set(plain) >= {"diplomacy"}


# ---- re-resolution against the package index -------------------------------------------------


needs_index = pytest.mark.skipif(
    not os.environ.get("CI") and not index_reachable(),
    reason="re-resolving needs PyPI (never skipped in CI)",
)


@needs_index
def test_locks_re_resolve_to_themselves():
    """images/lock.py --check: each lock re-resolves, for its platform and Python, to itself."""
    problems = [p for name in ALL_NAMES for p in LOCK.check(LOCK.IMAGES_BY_NAME[name])]
    assert problems == []


@needs_index
def test_check_rejects_a_lock_that_does_not_resolve(tmp_path, monkeypatch):
    """A pin that breaks a requirement (transformers 5.6.0, which verl 0.9.1 excludes: the
    original verl[sglang] conflict) and a hand-added package are both caught."""
    for name in ("cpu",):
        shutil.copy(LOCK.IMAGES_BY_NAME[name].lock, tmp_path)
    monkeypatch.setattr(LOCK, "IMAGES", tmp_path)
    image = LOCK.IMAGES_BY_NAME["cpu"]
    text = image.lock.read_text()
    version = pins_text_version(text, "transformers")
    image.lock.write_text(text.replace(f"transformers=={version} ", "transformers==5.6.0 "))
    (problem,) = LOCK.check(image)
    assert "does not resolve" in problem and "transformers" in problem

    extra = text + "six==1.17.0 \\\n    --hash=sha256:" + "0" * 64 + "\n"
    image.lock.write_text(extra)
    (problem,) = LOCK.check(image)
    assert "is stale" in problem and "six" in problem


def pins_text_version(text: str, pkg: str) -> str:
    return LOCK.parse_lock(text)[pkg][0]


# ---- the KFP SDK the images compile the pipeline with ----------------------------------------

# What `import kfp` and the compiler need from the KFP SDK (kfp-server-api comes in only where the
# dev venv's does not meet kfp's requirement: it is an sdist).
KFP_SDK = ("kfp", "kfp-kubernetes", "kfp-pipeline-spec")
SHIPPED_CONFIGS = ("pipeline.yaml", "pipeline-gpu.yaml", "pipeline-smollm2.yaml")


@pytest.mark.parametrize("name", NAMES)
def test_locked_kfp_meets_the_declared_minimum(name):
    """pyproject.toml declares the KFP SDK's range once (images/lock.py reads it); the code needs
    kfp 2.17 (`dsl.PipelineConfig(active_deadline_seconds=...)`), so the range excludes 2.16,
    and every image's lock pins kfp and kfp-kubernetes inside it."""
    lock = pins(name)
    for pkg in LOCK.KFP_PACKAGES:
        req = Requirement(LOCK.declared(pkg))
        assert not req.specifier.contains("2.16.1"), f"{req}: kfp 2.16 lacks what the code uses"
        assert req.specifier.contains("2.17.0"), req
        assert req.specifier.contains(lock[pkg][0]), f"{name}: {pkg}=={lock[pkg][0]}, needs {req}"
    assert lock["kfp"][0] == lock["kfp-kubernetes"][0], "kfp-kubernetes pins kfp's own release"


def kfp_sdk_pins() -> dict[tuple[str, ...], str]:
    """{locked (kfp, kfp-kubernetes, kfp-pipeline-spec) versions: the first lock pinning them}."""
    found: dict[tuple[str, ...], str] = {}
    for name in NAMES:
        found.setdefault(tuple(pins(name)[p][0] for p in KFP_SDK), name)
    return found


def venv_version(pkg: str) -> str | None:
    try:
        return importlib.metadata.version(pkg)
    except importlib.metadata.PackageNotFoundError:
        return None


def pip_install_from_lock(packages, lock: dict, target: Path) -> None:
    """pip-install the lock's pins of `packages` (its hashes required) into `target`, alone."""
    req = target.parent / f"requirements-{'-'.join(packages)}.txt"
    req.write_text(
        "".join(
            f"{p}=={lock[p][0]} " + " ".join(f"--hash={h}" for h in sorted(lock[p][1])) + "\n"
            for p in packages
        )
    )
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    cmd += ["--no-deps", "--require-hashes", "--no-build-isolation", "--target", str(target)]
    done = subprocess.run([*cmd, "-r", str(req)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr


def unmet_direct_needs(target: Path) -> list[str]:
    """Requirements of the packages in `target` that neither `target` nor the dev venv meets."""
    installed = {
        canonicalize_name(d.metadata["Name"]): d.version
        for d in importlib.metadata.distributions(path=[str(target)])
    }
    env = default_environment()
    bad = []
    for dist in importlib.metadata.distributions(path=[str(target)]):
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker and not req.marker.evaluate({**env, "extra": ""}):
                continue
            name = canonicalize_name(req.name)
            have = installed.get(name) or venv_version(name)
            if have is None or not req.specifier.contains(have, prereleases=True):
                bad.append(name)
    return sorted(set(bad))


# Runs in a fresh interpreter: the locked SDK (when installed) goes first on sys.path, then the
# project's own `sparring compile` writes each shipped config's IR.
COMPILE = """
import importlib.metadata, json, sys
target, out, packages, configs = sys.argv[1], sys.argv[2], sys.argv[3].split(","), sys.argv[4:]
if target:
    sys.path.insert(0, target)
import kfp, kfp.kubernetes, kfp.pipeline_spec
from sparring.cli import main
for i, config in enumerate(configs):
    main(["compile", "--config", config, "--iterations", "2", "--kfp-version", "2.17",
          "-o", f"{out}/{i}.yaml"], standalone_mode=False)
print(json.dumps({
    "versions": {p: importlib.metadata.version(p) for p in packages},
    "files": [m.__file__ for m in (kfp, kfp.kubernetes, kfp.pipeline_spec)],
}))
"""


@pytest.mark.slow
@pytest.mark.parametrize("versions", list(kfp_sdk_pins()), ids=lambda v: f"kfp-{v[0]}")
def test_the_locked_kfp_compiles_the_shipped_configs(versions, tmp_path):
    """The images' KFP SDK compiles every shipped config (the chart's registration Job compiles
    in the CPU image). The locked kfp, kfp-kubernetes and kfp-pipeline-spec wheels (by their
    lock hashes, --no-deps), plus any of their direct requirements the dev venv does not meet,
    are pip-installed from the index into a throwaway --target; a subprocess with that target
    first on sys.path runs `sparring compile` on configs/pipeline*.yaml (2 unrolled iterations
    each: the kfp calls are those of any iteration count), and each IR must record the locked
    SDK (`sdkVersion: kfp-<locked>`) and, compiled for a KFP 2.17 backend, the run deadline
    kfp 2.17 added. Without the index the
    dev venv's SDK stands in when it is the locked one; otherwise the test skips (never in CI)."""
    lock = pins(kfp_sdk_pins()[versions])
    locked = dict(zip(KFP_SDK, versions, strict=True))
    venv = {p: venv_version(p) for p in KFP_SDK}
    target = tmp_path / "site"
    if index_reachable():
        target.mkdir()
        pip_install_from_lock(KFP_SDK, lock, target)
        if needs := unmet_direct_needs(target):
            missing = [n for n in needs if n not in lock]
            assert not missing, f"the KFP SDK needs packages its lock lacks: {missing}"
            pip_install_from_lock(needs, lock, target)
        assert unmet_direct_needs(target) == []
    elif venv == locked:
        target = None  # the dev venv holds exactly the locked SDK: compile with it
        warnings.warn(
            f"PyPI unreachable: compiled with the dev venv's KFP SDK (the locked {venv})",
            stacklevel=1,
        )
    elif os.environ.get("CI"):
        pytest.fail("installing the locked KFP SDK needs the package index (PyPI)")
    else:
        pytest.skip(
            f"installing the locked KFP SDK {locked} needs PyPI (unreachable); venv: {venv}"
        )

    out = tmp_path / "ir"
    out.mkdir()
    configs = [str(ROOT / "configs" / c) for c in SHIPPED_CONFIGS]
    done = subprocess.run(
        [sys.executable, "-c", COMPILE, str(target or ""), str(out), ",".join(KFP_SDK), *configs],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["versions"] == locked
    if target is not None:
        assert all(Path(f).is_relative_to(target) for f in report["files"]), report["files"]
    for i, config in enumerate(SHIPPED_CONFIGS):
        spec, platform = yaml.safe_load_all((out / f"{i}.yaml").read_text())
        assert spec["sdkVersion"] == f"kfp-{locked['kfp']}", config
        deadline = platform["platforms"]["kubernetes"]["pipelineConfig"]["activeDeadlineSeconds"]
        assert int(deadline) > 0, config


def test_the_registrys_image_stacks_are_the_locks():
    """sparring/image_stacks.py (the versions a registered model pins for the image that
    trained it) is what images/lock.py makes of the committed locks."""
    assert LOCK.STACKS_MODULE.read_text() == LOCK.stacks_module(), "run python images/lock.py"
    from sparring.image_stacks import STACKS

    images = [LOCK.IMAGES_BY_NAME[name] for name in NAMES]
    assert set(STACKS) == {i.name for i in images if not i.base}
    for image in images:  # a flavour pins its base's stack (its lock is constrained by it)
        stack = STACKS[image.base or image.name]
        assert stack == {p: pins(image.name)[p][0].split("+")[0] for p in LOCK.MODEL_PACKAGES}
