"""The images' lock files (images/requirements-<image>.lock, written by images/lock.py).

Offline: every pin is exact and hashed, the project's own requirements accept the locked
versions, the installed packages' declared requirements hold in each lock, and only the
`-diplomacy` locks hold the AGPL engine. Online (PyPI): images/lock.py --check re-resolves every
lock for its image's platform and Python and must reproduce it; a lock that does not resolve
fails. That test needs the index: it runs wherever PyPI answers and is never skipped in CI.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shutil
import socket
import sys
import tomllib
from pathlib import Path

import pytest
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
NAMES = list(LOCK.IMAGES_BY_NAME)


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


@pytest.mark.parametrize("name", NAMES)
def test_every_pin_is_exact_and_hashed(name):
    image = LOCK.IMAGES_BY_NAME[name]
    text = image.lock.read_text()
    assert text.startswith(LOCK.header(image))
    lock = pins(name)
    assert len(lock) > 100
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


def _index_reachable() -> bool:
    try:
        socket.create_connection(("pypi.org", 443), timeout=5).close()
    except OSError:
        return False
    return True


needs_index = pytest.mark.skipif(
    not os.environ.get("CI") and not _index_reachable(),
    reason="re-resolving needs PyPI (never skipped in CI)",
)


@needs_index
def test_locks_re_resolve_to_themselves():
    """images/lock.py --check: each lock re-resolves, for its platform and Python, to itself."""
    problems = [p for name in NAMES for p in LOCK.check(LOCK.IMAGES_BY_NAME[name])]
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
