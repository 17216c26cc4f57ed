"""Pin every runtime image's Python packages in a lock file with hashes, and check the locks.

    python images/lock.py                 # (re)write every images/requirements-<image>.lock
    python images/lock.py --only gpu      # one image
    python images/lock.py --check         # re-resolve each lock in place; exit 1 if any drifted

One lock per image. The MLflow server image (`mlflow`) is standalone: its lock resolves only
requirements-mlflow.in, with the CPU lock as constraints so that the server and the pipeline's
clients run one MLflow. Every other image's requirements are pyproject.toml's dependencies and its extras
named in `EXTRAS` (gguf: converting the named real models; textarena: its games), plus the
image's own `requirements-<flavour>.in`; they are resolved by `uv pip compile` for the image's
platform (its base image's glibc, x86_64) and Python 3.11, with every wheel's sha256. The `-diplomacy`
flavours resolve `requirements-diplomacy.in` on top, with the base image's lock as constraints,
so the shared packages keep their pins. The Dockerfiles install a lock with
`pip install --no-deps --require-hashes -r`, so an image holds exactly its lock.

Re-writing a lock keeps every pin its inputs still allow (uv reads the previous lock as its
preferences): adding a package adds it and its dependencies, and moves a pin only where they
need it. Delete a lock to resolve it from scratch.

`--check` resolves again with the committed lock as constraints: the result must be the same
packages, versions and hashes. It fails when a lock no longer resolves (a pin that breaks a
requirement), when an `.in` file or pyproject.toml gained or lost a package, or when a lock was
edited by hand. New upstream releases do not fail it (everything is pinned). It needs the package
index (PyPI); tests/test_locks.py runs it.

The KFP SDK's version range is declared once, in pyproject.toml's dependencies (`KFP_PACKAGES`;
`declared()` reads it): the pipeline code needs kfp 2.17 (`dsl.PipelineConfig(
active_deadline_seconds=...)`), and every lock resolves pyproject.toml, so no lock can fall back to
an older kfp. kfp 2.17 pins `requests` and `urllib3` exactly; while the range still allowed 2.16,
uv kept the previous lock's newer `requests` and quietly resolved kfp 2.16.1 instead.

Writing the locks also writes sparring/image_stacks.py: each image's pins of the packages a
registered model needs to load (`MODEL_PACKAGES`), which the registry writes into the model's
`requirements.txt` for the image that trained it (tests/test_locks.py checks it matches).

The CPU torch wheel (`torch==2.13.0+cpu`) is on PyTorch's CPU index, not on PyPI. It is found
through `--torch-cpu-links` (default: the folder named by $SPARRING_TORCH_CPU_LINKS, else
/opt/wheels when it holds that wheel, else PyTorch's CPU index page).
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IMAGES = ROOT / "images"
PYTHON_VERSION = "3.11"
TORCH_CPU_WHEEL = "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu/torch/"
# pyproject.toml extras every image holds. `diplomacy` (AGPL-3.0) is not one: only the
# `-diplomacy` flavours add it (requirements-diplomacy.in).
EXTRAS = ("gguf", "textarena")
# The KFP SDK packages whose version range pyproject.toml declares (see `declared`), and that
# every image must hold at a version in it: the Helm chart's registration Job compiles the
# pipeline inside the CPU image.
KFP_PACKAGES = ("kfp", "kfp-kubernetes")
# What a registered model pins (sparring.registry.stage_mlflow_model): sparring/image_stacks.py.
MODEL_PACKAGES = ("mlflow", "torch", "transformers")
STACKS_MODULE = ROOT / "sparring" / "image_stacks.py"


@dataclass(frozen=True)
class Image:
    """One runtime image's lock: what it resolves, for which platform, on top of which lock."""

    name: str  # the lock is images/requirements-<name>.lock; images/build.sh tags <v>-<name>
    inputs: tuple[str, ...]  # requirement files, relative to the repository root
    platform: str  # uv --python-platform: the base image's glibc (x86_64)
    base: str | None = None  # the image whose lock pins the shared packages (constraints)
    torch_cpu: bool = False  # needs the CPU torch wheel's location
    # Not built on the project: its inputs alone, no EXTRAS, and `base`'s lock constrains the
    # packages both hold without this image holding all of base's (the MLflow server image).
    standalone: bool = False

    @property
    def lock(self) -> Path:
        return IMAGES / f"requirements-{self.name}.lock"


CPU_IN = ("pyproject.toml", "images/requirements-cpu.in")
GPU_IN = ("pyproject.toml", "images/requirements-gpu.in")
DIPLOMACY_IN = ("images/requirements-diplomacy.in",)
MLFLOW_IN = ("images/requirements-mlflow.in",)
# python:3.11-slim-bookworm has glibc 2.36; nvidia/cuda:*-ubuntu22.04 has glibc 2.35.
IMAGES_BY_NAME = {
    i.name: i
    for i in (
        Image("cpu", CPU_IN, "x86_64-manylinux_2_36", torch_cpu=True),
        Image("gpu", GPU_IN, "x86_64-manylinux_2_35"),
        Image("cpu-diplomacy", CPU_IN + DIPLOMACY_IN, "x86_64-manylinux_2_36", "cpu", True),
        Image("gpu-diplomacy", GPU_IN + DIPLOMACY_IN, "x86_64-manylinux_2_35", "gpu"),
        Image("mlflow", MLFLOW_IN, "x86_64-manylinux_2_36", "cpu", standalone=True),
    )
}

REQ = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)")
HASH = re.compile(r"--hash=(sha256:[0-9a-f]{64})")


def parse_lock(text: str) -> dict[str, tuple[str, frozenset[str]]]:
    """{normalized name: (version, hashes)} of a `uv pip compile --generate-hashes` file."""
    pins: dict[str, tuple[str, frozenset[str]]] = {}
    name = None
    for line in text.splitlines():
        if m := REQ.match(line):
            name = normalize(m.group(1))
            pins[name] = (m.group(2), frozenset())
        for h in HASH.findall(line):
            if name is None:
                raise ValueError(f"hash before any requirement: {line!r}")
            version, hashes = pins[name]
            pins[name] = (version, hashes | {h})
    return pins


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def declared(package: str) -> str:
    """pyproject.toml's requirement on `package` (e.g. `kfp>=2.17,<2.18`): its one declaration."""
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    found = [d for d in deps if normalize(re.split(r"[\s\[<>=!~;]", d, maxsplit=1)[0]) == package]
    if len(found) != 1:
        raise ValueError(f"pyproject.toml declares {package} {len(found)} times: {found}")
    return found[0]


def torch_cpu_links() -> str:
    """Where `torch==2.13.0+cpu` is found (see the module docstring)."""
    if env := os.environ.get("SPARRING_TORCH_CPU_LINKS"):
        return env
    if (Path("/opt/wheels") / TORCH_CPU_WHEEL).exists():
        return "/opt/wheels"
    return TORCH_CPU_INDEX


def header(image: Image) -> str:
    base = f" on top of requirements-{image.base}.lock" if image.base else ""
    extras = f" (extras: {', '.join(EXTRAS)})"
    if image.standalone:
        base, extras = f", constrained by requirements-{image.base}.lock", ""
    return (
        f"# The `{image.name}` runtime image's Python packages{base}: generated by\n"
        f"#   python images/lock.py --only {image.name}\n"
        f"# from {', '.join(image.inputs)}{extras}, for {image.platform}\n"
        f"# and Python {PYTHON_VERSION}.\n"
        "# Do not edit; installed with pip install --no-deps --require-hashes -r <this file>.\n"
    )


def compile_lock(image: Image, out: Path, constraints: list[Path]) -> None:
    """`uv pip compile` the image's inputs into `out` (hashes, no header or annotations)."""
    cmd = [sys.executable, "-m", "uv", "pip", "compile", *image.inputs]
    cmd += [] if image.standalone else [f"--extra={extra}" for extra in EXTRAS]
    cmd += ["--python-platform", image.platform, "--python-version", PYTHON_VERSION]
    cmd += ["--generate-hashes", "--no-header", "--no-annotate", "--quiet", "-o", str(out)]
    for c in constraints:
        cmd += ["--constraint", str(c)]
    if image.torch_cpu:
        cmd += ["--find-links", torch_cpu_links()]
    env = {**os.environ, "UV_NO_CONFIG": "1"}
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise SystemExit(f"{image.name}: uv pip compile failed:\n{done.stderr.strip()}")


def pins_only(lock: Path, folder: Path) -> Path:
    """A constraints file `name==version` per package of `lock` (uv takes no hashes there)."""
    out = folder / f"{lock.stem}.constraints.txt"
    pins = parse_lock(lock.read_text())
    out.write_text("".join(f"{n}=={v}\n" for n, (v, _) in sorted(pins.items())))
    return out


def write(image: Image) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        constraints = [pins_only(IMAGES_BY_NAME[image.base].lock, Path(tmp))] if image.base else []
        out = Path(tmp) / "lock.txt"
        if image.lock.exists():  # uv prefers the versions already in its output file
            shutil.copy(image.lock, out)
        compile_lock(image, out, constraints)
        image.lock.write_text(header(image) + out.read_text())
    print(f"wrote {image.lock.relative_to(ROOT)} ({len(parse_lock(image.lock.read_text()))} pins)")


def check(image: Image) -> list[str]:
    """Problems with the committed lock of `image` (empty when it re-resolves to itself)."""
    if not image.lock.exists():
        return [f"{image.lock.name} is missing: run python images/lock.py --only {image.name}"]
    committed = parse_lock(image.lock.read_text())
    problems = []
    if image.base:
        base = parse_lock(IMAGES_BY_NAME[image.base].lock.read_text())
        shared = [n for n in base if n in committed or not image.standalone]
        changed = sorted(n for n in shared if committed.get(n, ("",))[0] != base[n][0])
        if changed:
            problems.append(f"{image.lock.name} does not keep {image.base}'s pins: {changed}")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "lock.txt"
        try:
            compile_lock(image, out, [pins_only(image.lock, Path(tmp))])
        except SystemExit as e:
            return [*problems, f"{image.lock.name} does not resolve: {e}"]
        fresh = parse_lock(out.read_text())
    if fresh != committed:
        diff = difflib.unified_diff(
            [f"{n}=={v} ({len(h)} hashes)" for n, (v, h) in sorted(committed.items())],
            [f"{n}=={v} ({len(h)} hashes)" for n, (v, h) in sorted(fresh.items())],
            "committed",
            "re-resolved",
            lineterm="",
        )
        problems.append(
            f"{image.lock.name} is stale: run python images/lock.py --only {image.name}\n"
            + "\n".join(diff)
        )
    return problems


def stacks_module() -> str:
    """sparring/image_stacks.py as the committed locks make it: {image: {package: version}}
    of MODEL_PACKAGES for each base image (a local version such as torch's `+cpu` dropped: pip
    resolves the public one). A flavoured image resolves on top of its base's lock, so it
    shares its base's stack (tests/test_locks.py checks it)."""
    lines = [
        '"""Each runtime image\'s versions of the packages a registered model needs to load, from\n',
        "its lock (images/requirements-<image>.lock). Generated by `python images/lock.py`; do\n",
        "not edit. sparring.registry pins them in the model of the image that trained it; a\n",
        'flavoured image (`<version>-gpu-<flavour>`) has its base image\'s."""\n\n',
        "MODEL_PACKAGES = (" + ", ".join(f'"{p}"' for p in MODEL_PACKAGES) + ")\n",
        "STACKS: dict[str, dict[str, str]] = {\n",
    ]
    for name, image in IMAGES_BY_NAME.items():
        if not image.lock.exists() or image.standalone or image.base:  # bases only
            continue
        pins = parse_lock(image.lock.read_text())
        versions = ", ".join(f'"{p}": "{pins[p][0].split("+")[0]}"' for p in MODEL_PACKAGES)
        lines.append(f'    "{name}": {{{versions}}},\n')
    return "".join(lines) + "}\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=sorted(IMAGES_BY_NAME), action="append")
    parser.add_argument("--check", action="store_true", help="verify instead of writing")
    args = parser.parse_args(argv)
    names = args.only or list(IMAGES_BY_NAME)
    if not args.check:
        for name in names:  # bases first: the dict lists them first
            write(IMAGES_BY_NAME[name])
        STACKS_MODULE.write_text(stacks_module())
        return 0
    problems = [p for name in names for p in check(IMAGES_BY_NAME[name])]
    if STACKS_MODULE.read_text() != stacks_module():
        problems.append(f"{STACKS_MODULE.name} is stale: run python images/lock.py")
    for p in problems:
        print(p, file=sys.stderr)
    if not problems:
        print(f"locks up to date: {', '.join(names)}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
