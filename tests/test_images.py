"""The runtime images, without a Docker engine: parse the Dockerfiles and check pins, install
order, extras, user and entry point; run build.sh in --dry-run/--print mode."""

from __future__ import annotations

import fnmatch
import re
import shlex
import subprocess
import tomllib
from pathlib import Path

import pytest

import sparring

ROOT = Path(__file__).resolve().parents[1]
IMAGES = ROOT / "images"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
BUILD = ["bash", str(IMAGES / "build.sh")]


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    out, buf = [], ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        buf += line[:-1] + " " if line.endswith("\\") else line
        if not line.endswith("\\"):
            op, _, args = buf.partition(" ")
            out.append((op.upper(), args.strip()))
            buf = ""
    return out


def stages(path: Path) -> list[list[tuple[str, str]]]:
    """Instructions split per FROM (the ARGs before the first FROM are their own stage)."""
    result: list[list[tuple[str, str]]] = [[]]
    for op, args in instructions(path):
        if op == "FROM":
            result.append([])
        result[-1].append((op, args))
    return result


def resolve_base(path: Path, ref: str) -> str:
    """A FROM reference with ${ARG} replaced by the ARG's default."""
    defaults = dict(a.split("=", 1) for op, a in instructions(path) if op == "ARG" and "=" in a)
    return re.sub(r"\$\{?(\w+)\}?", lambda m: defaults[m.group(1)], ref)


FLAVORS = ["cpu", "gpu"]


def dockerfile(flavor: str) -> Path:
    return IMAGES / f"Dockerfile.{flavor}"


@pytest.mark.parametrize("flavor", FLAVORS)
def test_base_images_are_pinned(flavor):
    path = dockerfile(flavor)
    froms = [a.split()[0] for op, a in instructions(path) if op == "FROM"]
    assert len(froms) == 2, "a build stage and a small runtime stage"
    for ref in froms:
        image = resolve_base(path, ref)
        name, _, tag = image.partition(":")
        assert tag and tag != "latest", image
        assert re.search(r"\d+\.\d+\.\d+", tag) or "@sha256:" in image, (
            f"{image}: pin a full version"
        )
    if flavor == "gpu":
        assert all(resolve_base(path, r).startswith("nvidia/cuda:") for r in froms)
        build, runtime = (resolve_base(path, r) for r in froms)
        assert build.split(":")[1].split("-")[0] == runtime.split(":")[1].split("-")[0]  # same CUDA


@pytest.mark.parametrize("flavor", FLAVORS)
def test_torch_is_installed_first_and_pinned(flavor):
    runs = [a for op, a in stages(dockerfile(flavor))[1] if op == "RUN"]
    pip = [r for r in runs if "pip install" in r]
    first = pip[0]
    assert "torch==2.13.0" in first
    index = (
        "https://download.pytorch.org/whl/cpu" if flavor == "cpu" else "download.pytorch.org/whl/cu"
    )
    assert index in first or (flavor == "gpu" and "${TORCH_INDEX}" in first)
    if flavor == "gpu":
        assert (
            "ARG TORCH_INDEX=https://download.pytorch.org/whl/cu" in dockerfile(flavor).read_text()
        )
    # the project install is constrained to that torch, so nothing can swap it
    project = next(r for r in pip if "'.[" in r)
    assert "-c /tmp/constraints.txt" in project
    assert 'echo "torch==2.13.0" > /tmp/constraints.txt' in first


@pytest.mark.parametrize("flavor", FLAVORS)
def test_project_installed_with_the_extras_components_import(flavor):
    text = " ".join(a for op, a in instructions(dockerfile(flavor)) if op == "RUN")
    extras = set(re.search(r"'\.\[([\w,]+)\]'", text).group(1).split(","))
    assert extras <= set(PYPROJECT["project"]["optional-dependencies"])
    assert "diplomacy" in extras  # the Diplomacy game the components can run
    assert "dev" not in extras
    # every pip requirement other than the project itself is pinned with ==
    installs = [
        m
        for op, a in instructions(dockerfile(flavor))
        if op == "RUN"
        for m in re.findall(r"pip install ([^&]+)", a)
    ]
    assert len(installs) == 2
    for run in installs:
        for token in shlex.split(run):
            if (
                token.startswith("-")
                or token.startswith(".[")
                or token.startswith("$")
                or "://" in token
            ):
                continue
            if token in ("/tmp/constraints.txt",):
                continue
            assert "==" in token, f"unpinned requirement {token!r} in Dockerfile.{flavor}"
    if flavor == "gpu":
        verl_pin = next(d for d in PYPROJECT["project"]["dependencies"] if d.startswith("verl"))
        assert f"verl[sglang]=={verl_pin.split('==')[1]}" in text


@pytest.mark.parametrize("flavor", FLAVORS)
def test_copies_what_pip_install_needs_and_dockerignore_keeps_it(flavor):
    copies = [a.split()[:-1] for op, a in stages(dockerfile(flavor))[1] if op == "COPY"]
    sources = {s for srcs in copies for s in srcs}
    package_dirs = set(PYPROJECT["tool"]["setuptools"]["package-dir"].values())
    assert {"pyproject.toml", PYPROJECT["project"]["readme"]} | package_dirs <= sources
    patterns = [
        p.strip()
        for p in (ROOT / ".dockerignore").read_text().splitlines()
        if p.strip() and not p.startswith("#")
    ]

    def ignored(path: str) -> bool:
        result = False
        for p in patterns:
            negate = p.startswith("!")
            pat = p.lstrip("!").rstrip("/")
            if fnmatch.fnmatch(path, pat) or fnmatch.fnmatch(path.split("/")[0], pat):
                result = not negate
        return result

    for src in sources:
        assert not ignored(src), f"{src} is excluded by .dockerignore"
    for junk in (".venv", ".git", "runs", "mlruns", "tests"):
        assert ignored(junk)


@pytest.mark.parametrize("flavor", FLAVORS)
def test_runtime_stage_is_small_non_root_with_an_entry_point(flavor):
    runtime = stages(dockerfile(flavor))[-1]
    ops = [op for op, _ in runtime]
    assert ("COPY", "--from=build /opt/venv /opt/venv") in runtime
    assert "--from=build" in dict(runtime)["COPY"]
    # nothing is pip-installed or copied from the build context in the final stage
    assert not any("pip install" in a for op, a in runtime if op == "RUN")
    assert all(a.startswith("--from=") for op, a in runtime if op == "COPY")
    user = [a for op, a in runtime if op == "USER"]
    assert user and user[-1].split(":")[0] not in ("root", "0")
    assert ops.index("USER") > max(
        i for i, op in enumerate(ops) if op == "RUN"
    )  # last RUN as root only
    uid = user[-1].split(":")[0]
    assert f"--uid {uid}" in " ".join(a for op, a in runtime if op == "RUN")
    entry = [a for op, a in runtime if op == "ENTRYPOINT"]
    assert entry == ['["sparring"]']
    assert "sparring" in PYPROJECT["project"]["scripts"]
    env = " ".join(a for op, a in runtime if op == "ENV")
    assert (
        "PATH=/opt/venv/bin:$PATH" in env
    )  # `python3`/`sparring` for KFP's command resolve to the venv


def test_python_is_311():
    cpu = resolve_base(dockerfile("cpu"), instructions(dockerfile("cpu"))[1][1].split()[0])
    assert cpu.startswith("python:3.11.")
    gpu_text = dockerfile("gpu").read_text()
    assert "python3.11 -m venv /opt/venv" in gpu_text


def test_one_version_tags_both_images():
    refs = subprocess.run(
        [*BUILD, "--print"], capture_output=True, text=True, check=True
    ).stdout.split()
    v = sparring.__version__
    assert refs == [f"ghcr.io/sparring/sparring:{v}-cpu", f"ghcr.io/sparring/sparring:{v}-gpu"]
    # pyproject's static version must agree with sparring.__version__ (the images' tag)
    assert PYPROJECT["project"]["version"] == v


def test_build_dry_run_builds_and_pushes_both(tmp_path):
    out = subprocess.run(
        [*BUILD, "--dry-run", "--push", "--repository", "registry.example.com/ml/sparring"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    v = sparring.__version__
    builds = [shlex.split(line) for line in out if " build " in f" {line} "]
    pushes = [shlex.split(line) for line in out if " push " in f" {line} "]
    assert [b[b.index("-t") + 1] for b in builds] == [
        f"registry.example.com/ml/sparring:{v}-{f}" for f in FLAVORS
    ]
    assert [b[b.index("-f") + 1] for b in builds] == [str(dockerfile(f)) for f in FLAVORS]
    assert all(b[-1] == str(ROOT) and f"SPARRING_VERSION={v}" in b for b in builds)
    assert [p[-1] for p in pushes] == [f"registry.example.com/ml/sparring:{v}-{f}" for f in FLAVORS]


def test_build_script_help_and_bad_flags():
    help_text = subprocess.run(
        [*BUILD, "--help"], capture_output=True, text=True, check=True
    ).stdout
    for flag in ("--push", "--only", "--repository", "--dry-run", "--print"):
        assert flag in help_text
    bad = subprocess.run([*BUILD, "--only", "tpu"], capture_output=True, text=True)
    assert bad.returncode == 2 and "--only takes cpu or gpu" in bad.stderr
    unknown = subprocess.run([*BUILD, "--frobnicate"], capture_output=True, text=True)
    assert unknown.returncode == 2 and "unknown option" in unknown.stderr


def test_chart_default_repository_matches_build_script():
    import yaml

    values = yaml.safe_load((ROOT / "helm" / "sparring" / "values.yaml").read_text())
    refs = subprocess.run(
        [*BUILD, "--print", "--only", "cpu"], capture_output=True, text=True, check=True
    ).stdout
    assert refs.strip().rsplit(":", 1)[0] == values["image"]["repository"]


def test_wheel_ships_every_module_and_config(tmp_path):
    """What `pip install .` puts in an image: every source module under its package name, the
    shipped configs (the embedded default) and the committed pipeline YAML."""
    import sys
    import zipfile

    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("sparring-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    dirs = PYPROJECT["tool"]["setuptools"]["package-dir"]
    for package, folder in dirs.items():
        for source in (ROOT / folder).rglob("*"):
            if source.suffix in (".py", ".yaml") and "__pycache__" not in source.parts:
                inner = source.relative_to(ROOT / folder).as_posix()
                assert f"{package.replace('.', '/')}/{inner}" in names, f"{source} not in wheel"
    assert "sparring/configs/pipeline.yaml" in names and "sparring/pipelines/selfplay.yaml" in names
