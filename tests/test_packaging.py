"""The package list in pyproject.toml is explicit (discovery would walk the fixture symlink cycles):
every package directory must be in it, or an install would silently miss it."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


#: Directories of data files that setuptools sees as (namespace) packages: listed too, or every
#: install prints a "Package would be ignored" warning box.
DATA_PACKAGES = {"rocmforge_supervisor.service.control.static"}


def test_every_package_is_listed() -> None:
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {
        ".".join(p.parent.relative_to(ROOT).parts)
        for p in (ROOT / "rocmforge_supervisor").rglob("__init__.py")
    }
    assert found | DATA_PACKAGES == listed


def test_make_run_installs_no_dev_tools(tmp_path: Path) -> None:
    """`make run` is the user's path: it installs the package alone; pytest, ruff, mypy and the
    tests' second model come only with `make test` (issue 14: it used to install `.[demo,dev]`)."""
    venv = tmp_path / "venv"  # never created: -n only prints what make would run
    run = subprocess.run(
        ["make", "-n", "run", f"VENV={venv}"], cwd=ROOT, capture_output=True, text=True, timeout=30
    )
    assert run.returncode == 0, run.stderr
    installs = [ln.split("pip install", 1)[1] for ln in run.stdout.splitlines() if "pip install" in ln]
    assert installs and not any("dev" in ln or "demo" in ln for ln in installs), installs
    test = subprocess.run(
        ["make", "-n", "test", f"VENV={venv}"], cwd=ROOT, capture_output=True, text=True, timeout=30
    )
    assert any("pip install" in ln and "[demo,dev]" in ln for ln in test.stdout.splitlines()), test.stdout


@pytest.mark.slow
def test_wheel_builds_without_licence_deprecation(tmp_path: Path) -> None:
    """A real PEP 517 build of our pyproject (isolated: it fetches the pinned setuptools from PyPI)
    declares the licence the non-deprecated way: an SPDX expression and the licence file (the
    old ``license = { text = … }`` table printed setuptools' deprecation box on every install)."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, src / name)
    shutil.copytree(ROOT / "rocmforge_supervisor", src / "rocmforge_supervisor")
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(tmp_path / "dist"), str(src)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    # setuptools' warning boxes (the licence table, a data directory missing from `packages`)
    # are printed by every `pip install`, `make run`'s included.
    assert "BuildBackendWarning" not in done.stdout + done.stderr, (done.stdout + done.stderr)[-3000:]
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    with zipfile.ZipFile(wheel) as zf:
        meta = zf.read(next(n for n in zf.namelist() if n.endswith("METADATA"))).decode()
        names = zf.namelist()
        assert any(n.endswith("licenses/LICENSE") for n in names)
    assert "License-Expression: MIT" in meta
    assert "rocmforge_supervisor/service/control/static/index.html" in names
