"""Device memory per process: what forge's own children hold on a device, and what others hold.

The device counters (``mem_info_vram_used``, NVML's ``used``, RAM in use) say how full a device is,
not whose memory it is. Yielding memory to other programs needs the split, so that forge's own
children growing never reads as "someone else needs the GPU". The sources, per vendor:

* AMD, compute (ROCm/HIP, so llama-server itself): KFD's ``/sys/class/kfd/kfd/proc/<pid>/vram_<gpu_id>``,
  one decimal byte count per GPU the process opened (the kernel's ``kfd_procfs_show`` writes
  ``"%llu\\n"``; ``gpu_id`` is the topology node's ``gpu_id`` file).
* AMD, graphics too (games, compositors, Vulkan): DRM fdinfo, ``/proc/<pid>/fdinfo/<fd>`` of each
  render/card node the process holds open, ``drm-memory-vram:\\t<n> [KiB|MiB]`` (kernel
  Documentation/gpu/drm-usage-stats.rst; newer kernels also print ``drm-resident-vram``, read when
  the legacy key is absent). One DRM client can sit behind several fds (dup, fork): it counts once,
  by ``drm-client-id``. ``drm-pdev`` names the GPU by PCI address.
* AMD, amdsmi's process list when the library loads (``vram_mem`` per pid).
* NVIDIA: NVML's compute and graphics process lists (``usedGpuMemory``, None under some drivers).
* The CPU (RAM is its "VRAM"): psutil's RSS per process.

The sources overlap (a HIP process's KFD memory may also show in its fdinfo): per process and
device the largest figure counts, never the sum. Nothing here raises for an unreadable source: a
process whose files we may not read (another user's) is simply not attributed, and callers treat
what is left (used minus ours) as others'.
"""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from ._sysfs import listdir, read_text, try_read_int, try_read_text
from ._types import Device

__all__ = ["ProcessMemory", "parse_fdinfo", "process_memory"]

_UNITS = {"": 1, "B": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3}


@dataclass(frozen=True)
class ProcessMemory:
    """Bytes one process holds on one device, with where the figure came from."""

    pid: int
    bytes: int
    source: str
    """``kfd``, ``fdinfo``, ``amdsmi``, ``nvml`` or ``rss``."""
    name: str | None = None
    """The process's name (``/proc/<pid>/comm``), when readable."""


@dataclass(frozen=True)
class FdinfoClient:
    """One DRM client as its fdinfo describes it."""

    pdev: str | None
    client_id: str | None
    vram_bytes: int


def parse_fdinfo(text: str) -> FdinfoClient | None:
    """A DRM fdinfo (``drm-driver`` present) → its client; None for any other fd's fdinfo."""
    keys: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            keys[key.strip()] = value.strip()
    if "drm-driver" not in keys:
        return None
    raw = keys.get("drm-memory-vram", keys.get("drm-resident-vram"))
    return FdinfoClient(keys.get("drm-pdev"), keys.get("drm-client-id"), _size(raw) if raw else 0)


def _size(value: str) -> int:
    """``123 KiB`` / ``5 MiB`` / ``4096`` (bytes) → bytes; 0 when it is none of those."""
    number, _, unit = value.partition(" ")
    if not number.isdigit() or unit.strip() not in _UNITS:
        return 0
    return int(number) * _UNITS[unit.strip()]


def process_memory(
    devices: Iterable[Device],
    *,
    sysfs_root: Path,
    proc_root: Path,
    pids: Collection[int] | None = None,
    use_amdsmi: bool = False,
    use_nvml: bool = False,
    amdsmi_module: Any = None,
    nvml_module: Any = None,
) -> dict[str, dict[int, ProcessMemory]]:
    """Per device key: the processes holding memory on it. ``pids`` limits the search to those
    processes (cheap: forge's own children); None looks at every process it may read."""
    out: dict[str, dict[int, ProcessMemory]] = {}
    for dev in devices:
        found: dict[int, ProcessMemory] = {}
        if dev.vendor == "amd":
            _merge(found, _kfd(dev, sysfs_root, pids))
            _merge(found, _fdinfo(dev, proc_root, pids))
            if use_amdsmi:
                _merge(found, _amdsmi(dev, pids, amdsmi_module))
        elif dev.vendor == "nvidia" and use_nvml:
            _merge(found, _nvml(dev, pids, nvml_module))
        elif dev.vendor == "cpu":
            _merge(found, _rss(pids))
        out[dev.key] = {pid: _named(p, proc_root) for pid, p in found.items()}
    return out


def _merge(into: dict[int, ProcessMemory], more: Iterable[ProcessMemory]) -> None:
    """Overlapping sources: the largest figure per process wins."""
    for p in more:
        old = into.get(p.pid)
        if old is None or p.bytes > old.bytes:
            name = p.name or (old.name if old is not None else None)
            into[p.pid] = ProcessMemory(p.pid, p.bytes, p.source, name)


def _named(p: ProcessMemory, proc_root: Path) -> ProcessMemory:
    if p.name:
        return p
    name = try_read_text(proc_root / str(p.pid) / "comm")
    return ProcessMemory(p.pid, p.bytes, p.source, name) if name else p


def _pid_dirs(root: Path, pids: Collection[int] | None) -> list[int]:
    if pids is not None:
        return [pid for pid in pids if (root / str(pid)).is_dir()]
    return [int(e) for e in listdir(root) if e.isdigit()]


# -- AMD ---------------------------------------------------------------------------------------------


def _kfd(dev: Device, sysfs_root: Path, pids: Collection[int] | None) -> list[ProcessMemory]:
    if dev.kfd_node is None:
        return []
    kfd = sysfs_root / "class" / "kfd" / "kfd"
    gpu_id = try_read_int(kfd / "topology" / "nodes" / str(dev.kfd_node) / "gpu_id")
    if not gpu_id:
        return []
    out = []
    for pid in _pid_dirs(kfd / "proc", pids):
        used = try_read_int(kfd / "proc" / str(pid) / f"vram_{gpu_id}")
        if used:
            out.append(ProcessMemory(pid, used, "kfd"))
    return out


def _fdinfo(dev: Device, proc_root: Path, pids: Collection[int] | None) -> list[ProcessMemory]:
    if not dev.pci_bdf:
        return []
    out = []
    for pid in _pid_dirs(proc_root, pids):
        total = _fdinfo_vram(proc_root / str(pid), dev.pci_bdf)
        if total:
            out.append(ProcessMemory(pid, total, "fdinfo"))
    return out


def _fdinfo_vram(proc: Path, bdf: str) -> int:
    """The VRAM of one process's DRM clients on ``bdf``; each client once (by ``drm-client-id``).

    Only fds that point at a DRM node are read (``fd/N`` → ``/dev/dri/…``): a process may hold
    thousands of other fds, and reading one fdinfo per fd would make the poll costly."""
    seen: set[str] = set()
    total = 0
    for fd in listdir(proc / "fd"):
        try:
            if not str((proc / "fd" / fd).readlink()).startswith("/dev/dri/"):
                continue
            client = parse_fdinfo(read_text(proc / "fdinfo" / fd))
        except OSError:  # the fd closed meanwhile, or another user's process
            continue
        if client is None or (client.pdev or "").lower() != bdf.lower():
            continue
        key = client.client_id or f"fd{fd}"
        if key in seen:
            continue
        seen.add(key)
        total += client.vram_bytes
    return total


def _amdsmi(dev: Device, pids: Collection[int] | None, module: Any) -> list[ProcessMemory]:
    """amdsmi's process list of the GPU with ``dev``'s PCI address (nothing when amdsmi is absent)."""
    if not dev.pci_bdf:
        return []
    if module is None:
        from ._amdsmi import _import  # the same guarded import discovery uses

        module, _ = _import()
        if module is None:
            return []
    out: list[ProcessMemory] = []
    try:
        module.amdsmi_init()
    except Exception:  # no library, or a mismatched one: not a source here
        return []
    try:
        for handle in module.amdsmi_get_processor_handles():
            bdf = str(module.amdsmi_get_gpu_device_bdf(handle)).lower()
            if bdf != dev.pci_bdf.lower():
                continue
            for entry in module.amdsmi_get_gpu_process_list(handle):
                info = entry if isinstance(entry, dict) else module.amdsmi_get_gpu_process_info(handle, entry)
                pid, vram = _amdsmi_entry(info)
                if pid and vram and (pids is None or pid in pids):
                    name = info.get("name") if isinstance(info.get("name"), str) else None
                    out.append(ProcessMemory(pid, vram, "amdsmi", name or None))
    except Exception:  # a query this GPU or library version does not support
        return out
    finally:
        with contextlib.suppress(Exception):
            module.amdsmi_shut_down()
    return out


def _amdsmi_entry(info: Any) -> tuple[int, int]:
    if not isinstance(info, dict):
        return 0, 0
    pid = info.get("pid")
    usage = info.get("memory_usage")
    vram = usage.get("vram_mem") if isinstance(usage, dict) else None
    return (pid if isinstance(pid, int) else 0), (vram if isinstance(vram, int) else 0)


# -- NVIDIA ------------------------------------------------------------------------------------------


def _nvml(dev: Device, pids: Collection[int] | None, module: Any) -> list[ProcessMemory]:
    if not dev.uuid:
        return []
    from ._nvml import _init, _module

    try:
        nvml = _module(module)
    except ImportError:
        return []
    if _init(nvml):
        return []
    out: list[ProcessMemory] = []
    try:
        handle = nvml.nvmlDeviceGetHandleByUUID(dev.uuid)
        listed = [
            *nvml.nvmlDeviceGetComputeRunningProcesses(handle),
            *nvml.nvmlDeviceGetGraphicsRunningProcesses(handle),
        ]
    except Exception:  # NVMLError_*: this GPU is unreadable right now
        return []
    for p in listed:
        pid, used = getattr(p, "pid", None), getattr(p, "usedGpuMemory", None)
        if isinstance(pid, int) and isinstance(used, int) and used > 0 and (pids is None or pid in pids):
            out.append(ProcessMemory(pid, used, "nvml"))
    return out


# -- the CPU -----------------------------------------------------------------------------------------


def _rss(pids: Collection[int] | None) -> list[ProcessMemory]:
    out: list[ProcessMemory] = []
    procs = (
        [p for pid in pids if (p := _process(pid)) is not None]
        if pids is not None
        else list(psutil.process_iter())
    )
    for proc in procs:
        try:
            with proc.oneshot():
                out.append(ProcessMemory(proc.pid, int(proc.memory_info().rss), "rss", proc.name()))
        except psutil.Error:  # gone meanwhile, or not ours to read
            continue
    return out


def _process(pid: int) -> psutil.Process | None:
    try:
        return psutil.Process(pid)
    except psutil.Error:
        return None
