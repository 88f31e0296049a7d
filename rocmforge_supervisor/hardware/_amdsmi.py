"""amdsmi (ROCm's management library), when it imports and initialises: names, live use, sensors.

It is optional: sysfs already gives everything placement needs. ``import amdsmi`` fails in several
ways when ROCm's ``libamd_smi.so`` is missing or of another version (ImportError, OSError, KeyError,
AttributeError), and may print a loader message while doing so; all of these mean "not available",
and the message is kept off our stdout (``forge gpus --json`` must stay JSON).
"""

from __future__ import annotations

import contextlib
import importlib
import io
from dataclasses import dataclass
from typing import Any

from ._types import ProbeStatus

__all__ = ["AmdsmiGpu", "amdsmi_import_probe", "read_amdsmi"]

_IMPORT_ERRORS = (ImportError, OSError, KeyError, AttributeError)


@dataclass(frozen=True)
class AmdsmiGpu:
    """What amdsmi says about one GPU (None where it would not say)."""

    bdf: str
    kfd_node: int | None
    market_name: str | None
    vram_total_bytes: int | None
    vram_used_bytes: int | None
    temperature_c: float | None
    utilization_pct: float | None


def _import() -> tuple[Any, str | None]:
    noise = io.StringIO()
    try:
        with contextlib.redirect_stdout(noise), contextlib.redirect_stderr(noise):
            module = importlib.import_module("amdsmi")
    except _IMPORT_ERRORS as exc:
        return None, f"import amdsmi failed: {type(exc).__name__}: {exc}"
    return module, None


def amdsmi_import_probe(module: Any = None) -> ProbeStatus:
    """Without AMD GPUs nothing is queried; only say whether amdsmi would import."""
    if module is None:
        module, why = _import()
        if module is None:
            return ProbeStatus("amdsmi", False, f"not queried (no AMD GPU); {why}")
    return ProbeStatus("amdsmi", False, "not queried (no AMD GPU); the module imports")


def read_amdsmi(enabled: bool, module: Any = None) -> tuple[ProbeStatus, list[AmdsmiGpu]]:
    """Query every GPU amdsmi knows. ``module`` replaces ``import amdsmi`` (tests pass a stand-in)."""
    if not enabled:
        return ProbeStatus("amdsmi", False, "disabled (FORGE_USE_AMDSMI=0)"), []
    if module is None:
        module, why = _import()
        if module is None:
            return ProbeStatus("amdsmi", False, why or "not importable"), []
    try:
        module.amdsmi_init()
    except Exception as exc:  # AmdSmiLibraryException, or anything a mismatched library raises
        # One line: the library's message spans lines ("Error code:\n\t34 | AMDSMI_STATUS_…").
        detail = " ".join(str(exc).split())
        return ProbeStatus("amdsmi", False, f"amdsmi_init failed: {type(exc).__name__}: {detail}"), []
    try:
        handles = list(module.amdsmi_get_processor_handles())
        gpus = [_one(module, h) for h in handles]
    except Exception as exc:  # discovery never raises for a misbehaving library
        return ProbeStatus("amdsmi", False, f"amdsmi query failed: {type(exc).__name__}: {exc}"), []
    finally:
        with contextlib.suppress(Exception):
            module.amdsmi_shut_down()
    good = [g for g in gpus if g is not None]
    return ProbeStatus("amdsmi", True, f"{len(good)} GPU(s)"), good


def _call(fn: Any, *args: Any) -> Any:
    """One amdsmi query; None when it is unsupported on this GPU (it raises for that)."""
    try:
        return fn(*args)
    except Exception:  # AmdSmiLibraryException(NOT_SUPPORTED) and friends: that field is unknown
        return None


def _one(module: Any, handle: Any) -> AmdsmiGpu | None:
    bdf = _call(module.amdsmi_get_gpu_device_bdf, handle)
    if not isinstance(bdf, str) or not bdf:
        return None
    asic = _call(module.amdsmi_get_gpu_asic_info, handle) or {}
    name = asic.get("market_name") if isinstance(asic, dict) else None
    kfd_info = getattr(module, "amdsmi_get_gpu_kfd_info", None)
    kfd = _call(kfd_info, handle) if kfd_info is not None else None
    node = kfd.get("node_id") if isinstance(kfd, dict) else None
    total = used = None
    mem_type = getattr(getattr(module, "AmdSmiMemoryType", None), "VRAM", None)
    if mem_type is not None:
        total = _number(_call(module.amdsmi_get_gpu_memory_total, handle, mem_type))
        used = _number(_call(module.amdsmi_get_gpu_memory_usage, handle, mem_type))
    return AmdsmiGpu(
        bdf=bdf.lower(),
        kfd_node=node if isinstance(node, int) else None,
        market_name=name if isinstance(name, str) and name and name != "N/A" else None,
        vram_total_bytes=total,
        vram_used_bytes=used,
        temperature_c=_temperature(module, handle),
        utilization_pct=_utilization(module, handle),
    )


def _number(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _temperature(module: Any, handle: Any) -> float | None:
    kinds = getattr(module, "AmdSmiTemperatureType", None)
    metric = getattr(getattr(module, "AmdSmiTemperatureMetric", None), "CURRENT", None)
    if kinds is None or metric is None:
        return None
    for kind in ("EDGE", "HOTSPOT"):  # MI300 has no edge sensor
        sensor = getattr(kinds, kind, None)
        value = _call(module.amdsmi_get_temp_metric, handle, sensor, metric) if sensor is not None else None
        if isinstance(value, int | float) and value > 0:
            return float(value)
    return None


def _utilization(module: Any, handle: Any) -> float | None:
    activity = _call(module.amdsmi_get_gpu_activity, handle)
    value = activity.get("gfx_activity") if isinstance(activity, dict) else None
    return float(value) if isinstance(value, int | float) else None
