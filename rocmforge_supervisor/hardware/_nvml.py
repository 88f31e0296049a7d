"""NVIDIA GPUs through NVML (nvidia-ml-py), when the driver's libnvidia-ml loads.

NVML numbers GPUs in PCI order; CUDA does too once ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` (which the
children get), so ``Device.index`` is the CUDA ordinal after any inherited ``CUDA_VISIBLE_DEVICES``.
NVML stays initialised for the life of the process once it worked: ``refresh_usage`` re-reads used
memory through it before each placement.
"""

from __future__ import annotations

import threading
from typing import Any

from ._types import Device, ProbeStatus
from ._visible import visible_order

__all__ = ["nvml_used", "read_nvidia"]

_lock = threading.Lock()
_initialised: list[Any] = []  # NVML modules whose nvmlInit succeeded (kept: identity matters)


def _module(module: Any) -> Any:
    if module is not None:
        return module
    import pynvml  # an optional dependency (nvidia-ml-py): only when NVML is probed

    return pynvml


def _init(nvml: Any) -> str | None:
    """nvmlInit once per module; the reason when it fails (no driver: NVMLError_LibraryNotFound)."""
    with _lock:
        if any(m is nvml for m in _initialised):
            return None
        try:
            nvml.nvmlInit()
        except Exception as exc:  # NVMLError_*: no libnvidia-ml, no driver loaded, driver/library mismatch
            return f"nvmlInit failed: {exc}"
        _initialised.append(nvml)
        return None


def _text(value: Any) -> str:
    return value.decode("ascii", "replace") if isinstance(value, bytes) else str(value)


def _bdf(bus_id: str) -> str:
    """NVML's ``00000000:01:00.0`` → the kernel's ``0000:01:00.0``."""
    bus_id = bus_id.lower()
    domain, _, rest = bus_id.partition(":")
    if not rest or not domain or any(c not in "0123456789abcdef" for c in domain):
        return bus_id
    return f"{int(domain, 16):04x}:{rest}"


def read_nvidia(
    enabled: bool, inherited_cuda: str | None, module: Any = None
) -> tuple[ProbeStatus, list[Device]]:
    """Every GPU NVML lists. ``module`` replaces ``pynvml`` (tests pass a stand-in)."""
    if not enabled:
        return ProbeStatus("nvml", False, "disabled (FORGE_USE_NVML=0)"), []
    try:
        nvml = _module(module)
    except ImportError as exc:
        return ProbeStatus("nvml", False, f"import pynvml failed: {exc}"), []
    why = _init(nvml)
    if why:
        return ProbeStatus("nvml", False, why), []
    try:
        count = int(nvml.nvmlDeviceGetCount())
        driver = _text(nvml.nvmlSystemGetDriverVersion())
    except Exception as exc:  # a broken driver: NVML says so per call
        return ProbeStatus("nvml", False, f"NVML query failed: {exc}"), []
    raw = [_one(nvml, i) for i in range(count)]
    order = visible_order(inherited_cuda, [d.uuid for d in raw])
    devices: list[Device] = []
    for position, dev in enumerate(raw):
        if order is None:
            devices.append(dev)
        elif position in order:
            devices.append(_replace(dev, index=order.index(position)))
        else:
            why_hidden = f"hidden by the inherited CUDA_VISIBLE_DEVICES={inherited_cuda!r}"
            devices.append(_replace(dev, index=-1, usable=False, skip_reason=dev.skip_reason or why_hidden))
    devices.sort(key=lambda d: (d.index < 0, d.index))
    return ProbeStatus("nvml", True, f"{count} GPU(s), driver {driver}"), devices


def _replace(dev: Device, **changes: Any) -> Device:
    from dataclasses import replace

    return replace(dev, **changes)


def _one(nvml: Any, index: int) -> Device:
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        name = _text(nvml.nvmlDeviceGetName(handle))
        uuid = _text(nvml.nvmlDeviceGetUUID(handle))
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        bdf = _bdf(_text(nvml.nvmlDeviceGetPciInfo(handle).busId))
    except Exception as exc:  # a GPU that fell off the bus answers NVMLError_GpuIsLost
        return Device.unusable("nvidia", index, f"NVIDIA GPU {index}", f"NVML could not query it: {exc}")
    extra: dict[str, object] = {}
    capability = None
    try:
        major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
        capability = f"{major}.{minor}"
    except Exception:  # very old drivers: unknown, not fatal
        capability = None
    try:
        extra["temperature_c"] = float(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU))
        extra["utilization_pct"] = float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
    except Exception:  # sensors are optional (and unsupported on some boards)
        extra.setdefault("temperature_c", None)
    return Device(
        vendor="nvidia",
        index=index,
        name=name,
        vram_total_bytes=int(memory.total),
        vram_used_bytes=int(memory.used),
        uuid=uuid,
        pci_bdf=bdf,
        compute_capability=capability,
        extra=extra,
    )


def nvml_used(uuids: list[str], module: Any = None) -> dict[str, int]:
    """Used memory per UUID, for ``refresh_usage``; missing entries where NVML would not say."""
    nvml = _module(module)
    if _init(nvml):
        return {}
    used: dict[str, int] = {}
    for uuid in uuids:
        try:
            handle = nvml.nvmlDeviceGetHandleByUUID(uuid)
            used[uuid] = int(nvml.nvmlDeviceGetMemoryInfo(handle).used)
        except Exception:  # that one GPU is unreadable right now; keep its last value
            continue
    return used
