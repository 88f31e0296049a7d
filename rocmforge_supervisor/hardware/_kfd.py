"""``/dev/kfd``: whether ROCm's compute device is there and openable read-write, and what to do if not."""

from __future__ import annotations

import errno
import os
from pathlib import Path

from ._types import KfdStatus

__all__ = ["GROUPS_HINT", "check_kfd", "in_container"]

GROUPS_HINT = (
    "add the user to the render and video groups (sudo usermod -aG render,video $USER) and log in again"
)
CONTAINER_HINT = "start the container with --device /dev/kfd --device /dev/dri"


def in_container(machine_root: Path) -> bool:
    """Docker and Podman leave a marker file at the root of the container's filesystem."""
    return any((machine_root / marker).exists() for marker in (".dockerenv", "run/.containerenv"))


def check_kfd(dev_root: Path, machine_root: Path, sysfs_root: Path) -> KfdStatus:
    """Open ``<dev_root>/kfd`` read-write, as the ROCm runtime does, and close it again."""
    path = dev_root / "kfd"
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except OSError as exc:
        return _status_for(exc, path, machine_root, sysfs_root)
    os.close(fd)
    return KfdStatus(present=True, accessible=True)


def _status_for(exc: OSError, path: Path, machine_root: Path, sysfs_root: Path) -> KfdStatus:
    if exc.errno in (errno.EACCES, errno.EPERM):
        hint = GROUPS_HINT
        if in_container(machine_root):
            hint += " (in a container: --group-add video --group-add render, or keep-groups)"
        return KfdStatus(present=True, accessible=False, hint=f"{path}: permission denied; {hint}")
    if exc.errno in (errno.ENOENT, errno.ENOTDIR):
        if not (sysfs_root / "module" / "amdgpu").exists():
            hint = f"{path} is missing: no AMD GPU, or the amdgpu driver is not loaded (sudo modprobe amdgpu)"
        elif in_container(machine_root):
            hint = f"{path} is missing in this container; {CONTAINER_HINT}"
        else:
            hint = f"{path} is missing although amdgpu is loaded: it was built without KFD (HSA) support"
        return KfdStatus(present=False, accessible=False, hint=hint)
    return KfdStatus(
        present=path.exists(),
        accessible=False,
        hint=f"{path}: {exc.strerror or exc}; check the amdgpu driver (dmesg | grep -i kfd)",
    )
