"""Fixture machines: sysfs trees in the kernel's format under tests/fixtures/sysfs/<machine>/."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rocmforge_supervisor.config import ForgeSettings

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "sysfs"
MACHINES = ("rx7900xtx", "apu780m_rx7800xt", "mi300x_8", "mi300x_cpx", "strix_halo", "corrupted", "no_gpu")


def machine_settings(root: Path, **overrides: Any) -> ForgeSettings:
    """Settings that read ``root``'s sys/ and dev/, with every hardware setting pinned (the test
    process's own ROCR_VISIBLE_DEVICES etc. must not leak in)."""
    fields: dict[str, Any] = {
        "sysfs_root": root / "sys",
        "dev_root": root / "dev",
        "enable_igpu": False,
        "rocr_mask_by_uuid": False,
        "hsa_override_gfx_version": None,
        "inherited_rocr_visible_devices": None,
        "inherited_cuda_visible_devices": None,
        "use_amdsmi": False,
        "use_nvml": False,
    }
    fields.update(overrides)
    return ForgeSettings().model_copy(update=fields)


@pytest.fixture
def fixture_machine() -> Callable[..., ForgeSettings]:
    """Settings for a committed fixture machine (read-only)."""

    def make(name: str, **overrides: Any) -> ForgeSettings:
        return machine_settings(FIXTURES / name, **overrides)

    return make


@pytest.fixture
def copy_machine(tmp_path: Path) -> Callable[[str], Path]:
    """A writable copy of a fixture machine (symlinks kept relative, as in sysfs)."""

    def copy(name: str) -> Path:
        dst = tmp_path / name
        shutil.copytree(FIXTURES / name, dst, symlinks=True)
        return dst

    return copy
