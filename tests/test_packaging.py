"""The package list in pyproject.toml is explicit (discovery would walk the fixture symlink cycles):
every package directory must be in it, or an install would silently miss it."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_is_listed() -> None:
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {
        ".".join(p.parent.relative_to(ROOT).parts)
        for p in (ROOT / "rocmforge_supervisor").rglob("__init__.py")
    }
    assert found == listed
