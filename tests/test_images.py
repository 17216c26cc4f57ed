"""The runtime images, without a Docker engine: hadolint lints the Dockerfiles, dockerfile-parse
reads their stages (pins, installs from the lock files only, the AGPL flavour, non-root user,
entry point), and build.sh runs in --dry-run/--print mode. The lock files are tests/test_locks.py.
"""

from __future__ import annotations

import fnmatch
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from dockerfile_parse import DockerfileParser

import sparring

ROOT = Path(__file__).resolve().parents[1]
IMAGES = ROOT / "images"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
BUILD = ["bash", str(IMAGES / "build.sh")]
BASES = ["cpu", "gpu"]  # one Dockerfile each
FLAVORS = ["cpu", "gpu", "cpu-diplomacy", "gpu-diplomacy"]  # one image (and lock) each
MLFLOW = "mlflow"  # the chart's MLflow server: images/Dockerfile.mlflow, one stage chain
IMAGES_BUILT = [*FLAVORS, MLFLOW]  # what build.sh tags, in its order
HADOLINT = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")


def dockerfile(base: str) -> Path:
    return IMAGES / f"Dockerfile.{base}"


def parse(base: str) -> DockerfileParser:
    return DockerfileParser(fileobj=dockerfile(base).open("rb"), env_replace=False)


def stages(base: str) -> dict[str, dict]:
    """{stage name: {"from": parent, "ops": [(INSTRUCTION, value)]}} in file order."""
    out: dict[str, dict] = {}
    current = None
    for ins in parse(base).structure:
        op, value = ins["instruction"], " ".join(ins["value"].split())
        if op == "FROM":
            ref, _, name = value.partition(" AS ")
            current = out[name.strip()] = {"from": ref.strip(), "ops": []}
        elif current is not None and op != "COMMENT":
            current["ops"].append((op, value))
    return out


def chain(base: str, stage: str) -> list[str]:
    """`stage` and the stages it is built FROM, nearest first."""
    all_stages = stages(base)
    names = [stage]
    while all_stages[names[-1]]["from"] in all_stages:
        names.append(all_stages[names[-1]]["from"])
    return names


def target(flavor: str) -> tuple[str, str]:
    """(Dockerfile base, --target) of an image flavour, as build.sh builds it."""
    base, _, extra = flavor.partition("-")
    return base, "diplomacy" if extra == "diplomacy" else "runtime"


def arg_defaults(base: str) -> dict[str, str]:
    return dict(
        v.split("=", 1) for op, v in parse_ops(base) if op == "ARG" and "=" in v
    )  # ARG NAME=default


def parse_ops(base: str) -> list[tuple[str, str]]:
    return [(i["instruction"], i["value"]) for i in parse(base).structure]


def resolve(base: str, ref: str) -> str:
    defaults = arg_defaults(base)
    return re.sub(r"\$\{?(\w+)\}?", lambda m: defaults[m.group(1)], ref)


def runs(base: str, stage: str) -> list[str]:
    return [v for op, v in stages(base)[stage]["ops"] if op == "RUN"]


# ---- hadolint ------------------------------------------------------------------------------


@pytest.mark.parametrize("base", BASES)
def test_hadolint_passes(base):
    done = subprocess.run(
        [HADOLINT, "--config", str(IMAGES / "hadolint.yaml"), str(dockerfile(base))],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_hadolint_fails_a_bad_dockerfile(tmp_path):
    """The lint gate is real: an unpinned base, `cd` in RUN and a root user all fail it."""
    bad = tmp_path / "Dockerfile"
    bad.write_text(
        dockerfile("cpu").read_text()
        + "\nFROM python:latest\nRUN cd /tmp && pip install --no-cache-dir requests\nUSER root\n"
    )
    done = subprocess.run(
        [HADOLINT, "--config", str(IMAGES / "hadolint.yaml"), str(bad)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1
    for rule in ("DL3007", "DL3003", "DL3013", "DL3002"):
        assert rule in done.stdout, done.stdout


# ---- structure -----------------------------------------------------------------------------


@pytest.mark.parametrize("base", BASES)
def test_stages_and_default_target(base):
    names = list(stages(base))
    # the default target (the last stage) is the Apache-2.0 runtime image
    assert names[-1] == "runtime"
    assert {"build", "build-diplomacy", "runtime-base", "diplomacy", "runtime"} <= set(names)
    assert chain(base, "build-diplomacy")[:2] == ["build-diplomacy", "build"]
    for final in ("runtime", "diplomacy"):
        assert chain(base, final)[1] == "runtime-base"
    assert "build" not in chain(base, "runtime") and "build" not in chain(base, "diplomacy")


@pytest.mark.parametrize("base", BASES)
def test_base_images_are_pinned(base):
    refs = {resolve(base, s["from"]) for s in stages(base).values()} - set(stages(base))
    assert len(refs) == 1, f"one base image for every stage: {refs}"
    (image,) = refs
    name, _, tag = image.partition(":")
    assert tag and tag != "latest", image
    assert re.search(r"\d+\.\d+\.\d+", tag) or "@sha256:" in image, f"{image}: pin a full version"
    if base == "cpu":
        assert image.startswith("python:3.11.") and "bookworm" in tag
    else:
        assert image.startswith("nvidia/cuda:") and tag.endswith("ubuntu22.04")


def test_gpu_base_cuda_matches_the_locked_torch():
    """torch's CUDA wheels (nvidia-cuda-runtime in the lock) and the base image agree on the
    CUDA major.minor, so the image's CUDA runtime and torch's are the same release line."""
    lock = (IMAGES / "requirements-gpu.lock").read_text()
    runtime = re.search(r"^nvidia-cuda-runtime(?:-cu\d+)?==(\d+)\.(\d+)\.", lock, re.M)
    assert runtime, "torch's CUDA runtime wheel is in the GPU lock"
    image = resolve("gpu", stages("gpu")["python"]["from"])
    cuda = re.match(r"nvidia/cuda:(\d+)\.(\d+)\.\d+-", image)
    assert cuda and cuda.groups() == runtime.groups(), (image, runtime.group(0))


@pytest.mark.parametrize("flavor", FLAVORS)
def test_python_packages_come_from_the_flavors_lock_only(flavor):
    """Every pip install in the target's build chain is a hashed lock (--no-deps), or the
    project itself (--no-deps); `pip check` proves the set consistent."""
    base, tgt = target(flavor)
    build = "build-diplomacy" if tgt == "diplomacy" else "build"
    locks_used, project_installs = [], 0
    for stage in chain(base, build):
        ops = stages(base)[stage]["ops"]
        copies = {
            v.split()[-1]: v.split()[0] for op, v in ops if op == "COPY" and "--from" not in v
        }
        installs = [r for r in runs(base, stage) if "pip install" in r]
        if installs:
            assert "pip check" in installs[-1], "check the installed set after installing"
        for run in installs:
            for cmd in re.findall(r"pip install ([^&]+)", run):
                args = shlex.split(cmd)
                assert "--no-deps" in args, cmd
                valued = {"-r", "--extra-index-url"}  # options followed by a value
                values = {args[i + 1] for i, a in enumerate(args) if a in valued}
                operands = [a for a in args if not a.startswith("-") and a not in values]
                if "-r" in args:
                    assert "--require-hashes" in args and operands == [], cmd
                    locks_used.append(copies[args[args.index("-r") + 1]])
                else:
                    assert operands == ["."] and "--no-build-isolation" in args, cmd
                    project_installs += 1
    expected = [f"images/requirements-{base}.lock"]
    if tgt == "diplomacy":
        expected.insert(0, f"images/requirements-{base}-diplomacy.lock")
    assert locks_used == expected
    assert project_installs == 1


@pytest.mark.parametrize("flavor", FLAVORS)
def test_agpl_engine_only_in_diplomacy_flavors(flavor):
    base, tgt = target(flavor)
    final = stages(base)[tgt]
    labels = {}
    for op, v in final["ops"]:
        if op == "LABEL":
            labels.update(dict(p.split("=", 1) for p in shlex.split(v)))
    assert labels["org.opencontainers.image.title"] == f"sparring-{flavor}"
    text = " ".join(v for s in chain(base, tgt) for _, v in stages(base)[s]["ops"])
    copied_from = {v.split()[0].removeprefix("--from=") for op, v in final["ops"] if op == "COPY"}
    lock = (IMAGES / f"requirements-{flavor}.lock").read_text()
    if tgt == "diplomacy":
        assert labels["org.opencontainers.image.licenses"] == "Apache-2.0 AND AGPL-3.0-only"
        assert copied_from == {"build-diplomacy"}
        assert re.search(r"^diplomacy==1\.1\.2 ", lock, re.M)
    else:
        assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"
        assert copied_from == {"build"}
        assert "diplomacy" not in text.replace("runtime-base", "")
        assert not re.search(r"^diplomacy==", lock, re.M)


def test_gpu_runtime_has_a_c_compiler_and_python_headers():
    """Triton builds its launchers at run time: gcc, libc headers and Python.h must be in the
    stages the runtime image is built from, and no later stage removes them."""
    installed, purged = set(), set()
    for stage in reversed(chain("gpu", "runtime")):
        for run in runs("gpu", stage):
            for part in run.split("&&"):
                words = part.split()
                if words[:2] == ["apt-get", "install"]:
                    installed |= {w for w in words[2:] if not w.startswith("-")}
                if words[:2] in (["apt-get", "purge"], ["apt-get", "remove"]):
                    purged |= {w for w in words[2:] if not w.startswith("-")}
    assert {"gcc", "libc6-dev", "python3.11-dev", "python3.11"} <= installed - purged


@pytest.mark.parametrize("base", BASES)
def test_runtime_is_non_root_openshift_ready_with_an_entry_point(base):
    rb = stages(base)["runtime-base"]["ops"]
    user = [v for op, v in rb if op == "USER"]
    assert user == ["10001:0"]
    ops = [op for op, _ in rb]
    assert ops.index("USER") > max(i for i, op in enumerate(ops) if op == "RUN")
    setup = " ".join(runs(base, "runtime-base"))
    assert "--uid 10001 --gid 0" in setup
    # OpenShift runs a random UID in group 0: the home must be group 0 and group-writable
    assert "chgrp -R 0 /home/sparring" in setup and "chmod -R g=u /home/sparring" in setup
    assert [v for op, v in rb if op == "ENTRYPOINT"] == ['["sparring"]']
    assert "sparring" in PYPROJECT["project"]["scripts"]
    env = " ".join(v for op, v in rb if op == "ENV")
    assert "PATH=/opt/venv/bin:$PATH" in env and "HOME=/home/sparring" in env
    for final in ("runtime", "diplomacy"):  # final stages only label and copy the venv
        ops = stages(base)[final]["ops"]
        assert {op for op, _ in ops} <= {"ARG", "LABEL", "COPY"}
        assert [v for op, v in ops if op == "COPY"][0].endswith("/opt/venv /opt/venv")


@pytest.mark.parametrize("base", BASES)
def test_copies_what_the_build_needs_and_dockerignore_keeps_it(base):
    sources = set()
    for stage in ("build", "build-diplomacy"):
        for op, v in stages(base)[stage]["ops"]:
            if op == "COPY" and "--from" not in v:
                sources |= set(v.split()[:-1])
    package_dirs = set(PYPROJECT["tool"]["setuptools"]["package-dir"].values())
    assert {"pyproject.toml", PYPROJECT["project"]["readme"]} | package_dirs <= sources
    assert {f"images/requirements-{base}.lock", f"images/requirements-{base}-diplomacy.lock"} <= (
        sources
    )
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
    for junk in (".venv", ".git", "runs", "mlruns", "tests", "images/lock.py"):
        assert ignored(junk), junk


def prebake_run(base: str) -> tuple[str, str]:
    """(stage, RUN text) of the step that fetches the pre-baked named models."""
    (found,) = [
        (stage, r)
        for stage in stages(base)
        for r in runs(base, stage)
        if "sparring model fetch" in r
    ]
    return found


@pytest.mark.parametrize("base", BASES)
def test_prebake_build_arg_defaults_to_smollm2(base):
    from sparring.model_zoo import MODELS

    stage, run = prebake_run(base)
    ops = stages(base)[stage]["ops"]
    assert ("ARG", "PREBAKE_MODELS=smollm2-135m-instruct") in ops  # in scope of the RUN
    assert ops.index(("ARG", "PREBAKE_MODELS=smollm2-135m-instruct")) < ops.index(("RUN", run))
    assert "for name in ${PREBAKE_MODELS}" in run
    assert "smollm2-135m-instruct" in MODELS


@pytest.mark.parametrize("flavor", FLAVORS)
def test_prebaked_models_are_built_then_copied_where_the_runtime_looks(flavor):
    """The fetch runs in `build` after the project is installed (so every image's build chain
    holds it), into a group-0, g=u folder; the final stage copies that folder from its build
    stage, owned by the runtime user, to the path $SPARRING_PREBAKED_MODELS names."""
    from sparring.model_zoo import PREBAKED_ENV

    base, tgt = target(flavor)
    stage, run = prebake_run(base)
    assert stage == "build"
    build_runs = runs(base, "build")
    project = [i for i, r in enumerate(build_runs) if "--no-build-isolation ." in r]
    assert project and build_runs.index(run) > project[0]
    folder = re.search(r"fetch --cache-dir (\S+) ", run).group(1)
    assert f"mkdir -p {folder}" in run
    assert f"chgrp -R 0 {folder}" in run and f"chmod -R g=u {folder}" in run
    env = " ".join(v for op, v in stages(base)["runtime-base"]["ops"] if op == "ENV")
    assert f"{PREBAKED_ENV}={folder}" in env.split()
    copies = [v.split() for op, v in stages(base)[tgt]["ops"] if op == "COPY"]
    (copy,) = [c for c in copies if c[-1] == folder]
    build_stage = copy[0].removeprefix("--from=")
    assert "build" in chain(base, build_stage)
    assert copy[1:] == ["--chown=10001:0", folder, folder]


def test_prebake_step_stops_the_build_on_a_bad_name(tmp_path):
    """The Dockerfile's RUN text, run by sh as docker would (the folder moved to tmp): an
    unknown name fails the step with the model zoo's message instead of baking nothing."""
    _, run = prebake_run("cpu")
    folder = re.search(r"fetch --cache-dir (\S+) ", run).group(1)
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "PREBAKE_MODELS": "gpt-9"}
    done = subprocess.run(
        ["sh", "-c", run.replace(folder, str(tmp_path / "models"))],
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1 and "unknown model name 'gpt-9'" in done.stderr
    assert (tmp_path / "models").is_dir()


# ---- the MLflow server image -------------------------------------------------------------------


def test_mlflow_image_lints_pins_its_base_and_installs_only_its_lock():
    """images/Dockerfile.mlflow: hadolint-clean, the CPU images' pinned base, a build stage
    that pip-installs exactly requirements-mlflow.lock (hashes, no deps, `pip check`) and
    imports the server's auth app, S3 and Postgres drivers; no project, no model."""
    done = subprocess.run(
        [HADOLINT, "--config", str(IMAGES / "hadolint.yaml"), str(dockerfile(MLFLOW))],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert list(stages(MLFLOW)) == ["build", "runtime"]
    bases = {resolve(MLFLOW, s["from"]) for s in stages(MLFLOW).values()}
    assert bases == {resolve("cpu", stages("cpu")["build"]["from"])}
    build = stages(MLFLOW)["build"]["ops"]
    copies = [v.split() for op, v in build if op == "COPY"]
    assert copies == [["images/requirements-mlflow.lock", "/tmp/requirements.lock"]]
    (install,) = [r for r in runs(MLFLOW, "build") if "pip install" in r]
    args = shlex.split(re.search(r"pip install ([^&]+)", install).group(1))
    assert {"--no-deps", "--require-hashes"} <= set(args)
    assert args[args.index("-r") + 1] == "/tmp/requirements.lock"
    assert (
        "pip check" in install and "import boto3, psycopg2, mlflow, mlflow.server.auth" in install
    )
    text = dockerfile(MLFLOW).read_text()
    assert "sparring model fetch" not in text and "--no-build-isolation ." not in text


def test_mlflow_image_is_non_root_openshift_ready_and_runs_mlflow():
    runtime = stages(MLFLOW)["runtime"]["ops"]
    assert [v for op, v in runtime if op == "USER"] == ["10001:0"]
    ops = [op for op, _ in runtime]
    assert ops.index("USER") > max(i for i, op in enumerate(ops) if op == "RUN")
    setup = " ".join(runs(MLFLOW, "runtime"))
    assert "--uid 10001 --gid 0" in setup and "chmod -R g=u /home/sparring" in setup
    assert [v for op, v in runtime if op == "ENTRYPOINT"] == ['["mlflow"]']
    assert [v.split()[0] for op, v in runtime if op == "COPY"] == ["--from=build"]
    labels = dict(p.split("=", 1) for op, v in runtime if op == "LABEL" for p in shlex.split(v))
    assert labels["org.opencontainers.image.title"] == "sparring-mlflow"
    assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"


# ---- build.sh ------------------------------------------------------------------------------


def test_one_version_tags_every_image():
    refs = subprocess.run(
        [*BUILD, "--print"], capture_output=True, text=True, check=True
    ).stdout.split()
    v = sparring.__version__
    assert refs == [f"ghcr.io/sparring/sparring:{v}-{f}" for f in IMAGES_BUILT]
    assert PYPROJECT["project"]["version"] == v


def test_build_dry_run_builds_and_pushes_every_flavor_with_its_target():
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
        f"registry.example.com/ml/sparring:{v}-{f}" for f in IMAGES_BUILT
    ]
    for b, flavor in zip(builds, IMAGES_BUILT, strict=True):
        base, tgt = target(flavor)
        assert b[b.index("-f") + 1] == str(dockerfile(base))
        assert b[b.index("--target") + 1] == tgt
        assert tgt in stages(base)
    assert all(b[-1] == str(ROOT) and f"SPARRING_VERSION={v}" in b for b in builds)
    assert [p[-1] for p in pushes] == [
        f"registry.example.com/ml/sparring:{v}-{f}" for f in IMAGES_BUILT
    ]


@pytest.mark.parametrize(
    ("flags", "arg"),
    [
        ([], None),  # the Dockerfiles' default
        (["--prebake", "smollm2-135m-instruct other"], "smollm2-135m-instruct other"),
        (["--no-prebake"], ""),
    ],
)
def test_build_dry_run_passes_the_prebake_arg(flags, arg):
    out = subprocess.run(
        [*BUILD, "--dry-run", *flags], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    builds = [shlex.split(line) for line in out]
    assert len(builds) == len(IMAGES_BUILT)
    for b, flavor in zip(builds, IMAGES_BUILT, strict=True):
        passed = [b[i + 1] for i, a in enumerate(b) if a == "--build-arg"]
        prebake = [v.split("=", 1)[1] for v in passed if v.startswith("PREBAKE_MODELS=")]
        # the MLflow server image holds no model: it has no PREBAKE_MODELS to pass
        assert prebake == ([] if arg is None or flavor == MLFLOW else [arg])


def test_build_script_help_and_bad_flags():
    help_text = subprocess.run(
        [*BUILD, "--help"], capture_output=True, text=True, check=True
    ).stdout
    for flag in ("--push", "--only", "--repository", "--dry-run", "--print", "--prebake", "AGPL"):
        assert flag in help_text
    bad = subprocess.run([*BUILD, "--only", "tpu"], capture_output=True, text=True)
    assert bad.returncode == 2 and "--only takes cpu, gpu" in bad.stderr and "mlflow" in bad.stderr
    unknown = subprocess.run([*BUILD, "--frobnicate"], capture_output=True, text=True)
    assert unknown.returncode == 2 and "unknown option" in unknown.stderr
    no_value = subprocess.run([*BUILD, "--prebake"], capture_output=True, text=True)
    assert no_value.returncode == 2 and "--prebake needs a value" in no_value.stderr


def test_chart_default_repository_matches_build_script():
    import yaml

    values = yaml.safe_load((ROOT / "helm" / "sparring" / "values.yaml").read_text())
    refs = subprocess.run(
        [*BUILD, "--print", "--only", "cpu"], capture_output=True, text=True, check=True
    ).stdout
    assert refs.strip().rsplit(":", 1)[0] == values["image"]["repository"]


def test_wheel_ships_every_module_and_config(tmp_path):
    """What `pip install --no-deps .` puts in an image: every source module under its package
    name, the shipped configs (the embedded default) and the committed pipeline YAML."""
    import zipfile

    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
        + ["-w", str(tmp_path), str(ROOT)],
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
