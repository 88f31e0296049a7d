"""The GPU backend's per-process device context, learned from forge's own children.

Every llama-server on a GPU holds memory no allocation line of its log reports: the backend's
context, its kernels, library handles (on an H100, 645 MiB of CUDA context next to 771 MiB of
allocations). One such figure per child is small beside a large model and decisive for many small
ones: ten 0.5 GiB models do not fit where their allocations alone would. So the estimate counts it
(:data:`~..models.DEVICE_CONTEXT_BYTES`, a default per backend), and forge replaces the default
with what it measures: once a child is ready, where per-process device memory is readable
(``hardware/_attribution.py``: NVML's process list, AMD's KFD/fdinfo/amdsmi), the device memory
the child holds minus its own logged allocations is the context of that backend on that GPU model.

The figures are kept per ``backend/GPU name`` (every H100 of a machine shares one) in
``<cache_dir>/device-context.json``, written atomically, and read for every placement. An
unreadable file is no error: the defaults apply and the next measurement rewrites it.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import anyio

from ..._files import write_text_atomic
from ...config import ForgeSettings
from ...hardware import Device, process_memory
from ...models import backend_of

__all__ = ["CONTEXT_FILE", "DeviceContexts", "context_id", "learn_from_child", "measured_context"]

log = logging.getLogger("rocmforge.supervisor")

#: The file under forge's cache dir.
CONTEXT_FILE = "device-context.json"
#: A difference above this is not a context (another allocation the log missed, a stale reading).
_MAX_CONTEXT = 8 * 1024**3


def context_id(dev: Device) -> str:
    """The key a measurement is kept under: the backend and the GPU model (``cuda/NVIDIA H100``)."""
    return f"{backend_of(dev.key)}/{dev.name}"


def measured_context(device_used: int, allocated: int) -> int | None:
    """The context one child shows: what it holds on the device minus its own allocations there;
    None when that is no plausible context (nothing allocated, nothing more, or too much more)."""
    if allocated <= 0 or device_used <= allocated:
        return None
    extra = device_used - allocated
    return extra if extra <= _MAX_CONTEXT else None


class DeviceContexts:
    """The learned figures, read from and written to one JSON file."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def _read(self) -> dict[str, dict[str, object]]:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return {k: v for k, v in data.items() if isinstance(v, dict)} if isinstance(data, dict) else {}

    def learned(self) -> dict[str, int]:
        """``backend/GPU name`` → bytes, as measured."""
        out = {}
        for k, v in self._read().items():
            n = v.get("bytes")
            if isinstance(n, int) and not isinstance(n, bool) and 0 <= n <= _MAX_CONTEXT:
                out[k] = n
        return out

    def for_devices(self, devices: Iterable[Device]) -> dict[str, int]:
        """Device key → its learned context, for the GPUs measured before (placement's input)."""
        learned = self.learned()
        return {
            d.key: learned[cid] for d in devices if d.vendor != "cpu" and (cid := context_id(d)) in learned
        }

    def record(self, dev: Device, context: int) -> None:
        """Keep ``context`` as the figure for ``dev``'s backend and GPU model (the newest wins)."""
        data = self._read()
        cid = context_id(dev)
        old = data.get(cid, {}).get("bytes")
        data[cid] = {"bytes": context, "measured_at": time.time()}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_text_atomic(self.path, json.dumps(data, indent=2, sort_keys=True) + "\n")
        except OSError as exc:  # a read-only cache: placement keeps the defaults
            log.warning("could not record the device context of %s in %s: %s", cid, self.path, exc)
            return
        if old != context:
            log.info("device context of %s measured: %d MiB", cid, context // 1024**2)

    def learn(
        self, devices: Iterable[Device], used: Mapping[str, int], allocated: Mapping[str, int]
    ) -> dict[str, int]:
        """Record what one ready child shows on each of its GPUs: ``used`` (device key → what it
        holds there, per-process) minus ``allocated`` (its logged allocations there). Returns
        the figures recorded, by device key."""
        out = {}
        for dev in devices:
            if dev.vendor == "cpu" or dev.key not in used:
                continue
            context = measured_context(used[dev.key], allocated.get(dev.key, 0))
            if context is not None:
                self.record(dev, context)
                out[dev.key] = context
        return out


async def learn_from_child(
    contexts: DeviceContexts,
    devices: Sequence[Device],
    pid: int,
    allocated: Mapping[str, int],
    settings: ForgeSettings,
) -> dict[str, int]:
    """Measure one ready child (``pid``) on its GPUs and record its device context there (in
    worker threads: NVML and sysfs reads block). Never raises: a failed reading learns nothing."""
    try:
        found = await anyio.to_thread.run_sync(
            lambda: process_memory(
                devices,
                sysfs_root=settings.sysfs_root,
                proc_root=settings.sysfs_root.parent / "proc",
                pids={pid},
                use_amdsmi=settings.use_amdsmi,
                use_nvml=settings.use_nvml,
            )
        )
        used = {key: procs[pid].bytes for key, procs in found.items() if pid in procs}
        return await anyio.to_thread.run_sync(lambda: contexts.learn(devices, used, allocated))
    except Exception:  # a bug here must not take the supervisor (and every child) down
        log.exception("measuring the device context of pid %d failed", pid)
        return {}
