"""The CPU: always a place a model can run. Its "VRAM" is system RAM (total, and total − available)."""

from __future__ import annotations

import os
from functools import lru_cache

import psutil

from ._types import Device

__all__ = ["cpu_device", "cpu_flags", "cpu_model_name", "ram_usage"]


@lru_cache(maxsize=1)
def _model_name() -> str:
    """The first ``model name`` in /proc/cpuinfo, reading only its first few KiB.

    Reading the whole file costs a call into every CPU's frequency driver on some kernels.
    """
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            head = f.read(8192)
    except OSError:
        return "CPU"
    for line in head.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in ("model name", "Model", "cpu model") and value.strip():
            return value.strip()
    return "CPU"


def cpu_model_name() -> str:
    return _model_name()


@lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """The first CPU's feature flags (x86 ``flags``, Arm ``Features``): what a native build was
    compiled for and what the AMX question is asked of. Only the first processor block is read."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if not line.strip():
                    break
                key, sep, value = line.partition(":")
                if sep and key.strip() in ("flags", "Features"):
                    return frozenset(value.split())
    except OSError:
        pass
    return frozenset()


def ram_usage() -> tuple[int, int, int]:
    """(total, used, available) bytes, where used = total − available (what placement subtracts)."""
    vm = psutil.virtual_memory()
    return int(vm.total), int(vm.total - vm.available), int(vm.available)


def cpu_device() -> Device:
    physical = psutil.cpu_count(logical=False)
    logical = psutil.cpu_count(logical=True) or os.cpu_count() or 1
    try:
        allowed = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        allowed = logical
    total, used, available = ram_usage()
    return Device(
        vendor="cpu",
        index=0,
        name=_model_name(),
        vram_total_bytes=total,
        vram_used_bytes=used,
        cores=physical or logical,
        extra={"logical_cpus": logical, "allowed_cpus": allowed, "ram_available_bytes": available},
    )
