"""Layers point down: the import-linter contracts of pyproject.toml ([tool.importlinter]) hold
on the installed layout, where components/ and pipelines/ are sparring.components and
sparring.pipelines (an editable install hides them from import-linter's graph)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT = Path(sys.executable).with_name("lint-imports")


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The project installed as a wheel would be, without dependencies."""
    target = tmp_path_factory.mktemp("layout")
    build = tmp_path_factory.mktemp("build")
    shutil.copytree(
        ROOT, build / "src", ignore=shutil.ignore_patterns(".*", "runs", "build", "*.egg-info")
    )
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--target", str(target), str(build / "src")],
        check=True, capture_output=True,
    )  # fmt: skip
    return target


def lint(target: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(target)}
    return subprocess.run(
        [str(LINT), str(ROOT / "pyproject.toml"), "--no-cache"],
        cwd=target, env=env, capture_output=True, text=True,
    )  # fmt: skip


def test_the_layering_contracts_hold(installed):
    result = lint(installed)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "4 kept, 0 broken" in result.stdout


def lint_with(installed: Path, tmp_path: Path, module: str, imported: str):
    """The contracts on a copy of the installed tree where `module` also imports `imported`."""
    planted = tmp_path / "planted"
    shutil.copytree(installed, planted)
    path = planted.joinpath(*module.split(".")).with_suffix(".py")
    path.write_text(path.read_text() + f"\nimport {imported}  # noqa\n")
    return lint(planted)


def test_a_library_module_importing_the_kfp_layer_breaks_them(installed, tmp_path):
    """The contracts can fail: the loop importing the KFP graph is reported."""
    result = lint_with(installed, tmp_path, "sparring.loop.tasks", "sparring.pipelines.selfplay")
    assert result.returncode != 0
    assert "sparring.loop.tasks -> sparring.pipelines.selfplay" in result.stdout


def test_two_packages_importing_each_other_break_them(installed, tmp_path):
    """The acyclic contract can fail: the games importing the trainer, which imports them."""
    result = lint_with(installed, tmp_path, "sparring.games.base", "sparring.train_config")
    assert result.returncode != 0
    assert "No two of sparring's packages and modules import each other BROKEN" in result.stdout
