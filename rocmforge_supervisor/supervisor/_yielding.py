"""The supervisor's pressure poll: every ``pressure_interval`` seconds, device memory is re-read,
split into forge's own and others' (:func:`~..hardware.process_memory`), and handed to the pure
policy (:mod:`._pressure`); the evictions it returns go through the normal unload path (reason
``pressure``), each with a ``pressure`` event that names the other process when it is known.

Only devices where a running model holds memory are looked at (evicting cannot help elsewhere).
Forge's own share is what per-process attribution finds for its children's pids; where no source
sees a child on a device (NVIDIA without NVML, say), what placement counted for it stands in.
The costly look at every process (to name the other program) happens only on a device that is
already short of its reserve.

Bound: an eviction starts within ``polls`` (2) consecutive polls of others' growth eating the
reserve, i.e. at most 2 × ``pressure_interval`` plus the reads, then takes the unload's drain
and stop time.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from typing import Protocol

import anyio

from .._units import format_bytes
from ..hardware import Device, ProcessMemory, process_memory
from ._events import EventKind
from .backends._host import PlacementHost
from .model._managed import ManagedModel
from .model._status import ModelState
from .placement._pressure import Candidate, DeviceSample, Eviction, PressureWatch

__all__ = ["PressureMonitor"]

log = logging.getLogger("rocmforge.supervisor")


def settle_seconds(interval: float) -> float:
    """After one of ours leaves a device (and after an eviction), the driver takes a moment to
    hand the memory back: the device is not judged meanwhile. Two polls, at least 1 s."""
    return max(1.0, 2 * interval)


class YieldingHost(PlacementHost, Protocol):
    """The supervisor as the poll sees it: placement's side, and the models whole (the poll reads
    their queues and children, which a plan never needs)."""

    @property
    def models(self) -> Mapping[str, ManagedModel]: ...


class PressureMonitor:
    """The poll and its memory (the policy's hysteresis, which models were where)."""

    def __init__(self, supervisor: YieldingHost) -> None:
        self._sup = supervisor
        self.watch = PressureWatch(cooldown=settle_seconds(supervisor.policy.pressure_interval))
        self._placed: set[tuple[str, str]] = set()  # (model, device) at the last poll
        self._moved_at: dict[str, float] = {}  # device → when one of ours last left it

    async def run(self) -> None:
        """Until cancelled. ``pressure_interval`` or ``vram_reserve`` 0: idle (a reload may set them)."""
        while True:
            policy = self._sup.policy
            if policy.pressure_interval <= 0 or policy.vram_reserve == 0:
                await anyio.sleep(1.0)
                continue
            await anyio.sleep(policy.pressure_interval)
            try:
                await self.poll()
            except Exception:  # a bug here must not take the supervisor (and every child) down
                log.exception("the memory-pressure poll failed")

    async def poll(self) -> list[Eviction]:
        """One look; the evictions it carried out."""
        sup = self._sup
        models = [m for m in sup.models.values() if m.running and m.as_loaded() is not None]
        if not models:  # nothing to yield: no reads, and every device forgets its baseline
            self._note_moves({}, time.monotonic())
            return self.watch.observe([], [])
        inventory = await sup.refresh_inventory()
        held = {m.name: dict(loaded.bytes_by_device) for m in models if (loaded := m.as_loaded())}
        keys = {k for b in held.values() for k, v in b.items() if v > 0}
        devices = [d for d in inventory.devices if d.key in keys and d.usable]
        pids = {pid: m for m in models if (pid := _pid(m)) is not None}
        settings = sup.settings
        ours = await anyio.to_thread.run_sync(
            lambda: process_memory(
                devices,
                sysfs_root=settings.sysfs_root,
                proc_root=settings.sysfs_root.parent / "proc",
                pids=set(pids),
                use_amdsmi=settings.use_amdsmi,
                use_nvml=settings.use_nvml,
            )
        )
        now = time.monotonic()
        self.watch.cooldown = settle_seconds(sup.policy.pressure_interval)
        self._note_moves(held, now)
        on = _attributed(models, held, ours)
        samples = [await self._sample(d, models, on, set(pids), now) for d in devices]
        candidates = [_candidate(m, on[m.name], now) for m in models]
        evictions = self.watch.observe(samples, candidates)
        for ev in evictions:
            await self._evict(ev)
        return evictions

    def _note_moves(self, held: dict[str, dict[str, int]], now: float) -> None:
        placed = {(name, k) for name, b in held.items() for k, v in b.items() if v > 0}
        for _name, key in self._placed - placed:
            self._moved_at[key] = now
        self._placed = placed

    async def _sample(
        self,
        dev: Device,
        models: list[ManagedModel],
        on: dict[str, dict[str, int]],
        pids: set[int],
        now: float,
    ) -> DeviceSample:
        on_it = [m for m in models if on[m.name].get(dev.key, 0) > 0]
        ours = sum(on[m.name][dev.key] for m in on_it)
        moved_at = self._moved_at.get(dev.key)
        settling = any(m.state != ModelState.READY for m in on_it) or (
            moved_at is not None and now - moved_at < self.watch.cooldown
        )
        reserve = self._sup.policy.reserve_for(dev.vram_total_bytes)
        top = None
        if reserve and dev.vram_free_bytes < reserve and not settling:
            top = await self._top_other(dev, pids)
        return DeviceSample(dev.key, dev.vram_total_bytes, dev.vram_used_bytes, ours, reserve, settling, top)

    async def _top_other(self, dev: Device, ours: set[int]) -> tuple[int, str | None, int] | None:
        """The other process holding the most on ``dev`` (every process we may read is looked at)."""
        settings = self._sup.settings
        found = await anyio.to_thread.run_sync(
            lambda: process_memory(
                [dev],
                sysfs_root=settings.sysfs_root,
                proc_root=settings.sysfs_root.parent / "proc",
                use_amdsmi=settings.use_amdsmi,
                use_nvml=settings.use_nvml,
            )
        )
        others = [p for p in found.get(dev.key, {}).values() if p.pid not in ours and p.pid != os.getpid()]
        if not others:
            return None
        top = max(others, key=lambda p: p.bytes)
        return top.pid, top.name, top.bytes

    async def _evict(self, ev: Eviction) -> None:
        sup = self._sup
        pid, name, size = ev.other or (None, None, None)
        who = f"{name or 'a process'} (pid {pid})" if pid is not None else "other programs"
        why = f"{format_bytes(ev.free)} free, below the reserve of {format_bytes(ev.reserve)}"
        log.warning("%s: %s took memory (%s): unloading %s", ev.device, who, why, ", ".join(ev.models))
        async with sup.placement_lock:
            for victim in ev.models:
                m = sup.models.get(victim)
                # Ready and idle now, or spared: it got busy, went, or crashed since the poll (a
                # restarting victim waits for this very lock in its placement: unloading it here
                # would wait for it forever).
                if m is None or m.state != ModelState.READY or m.in_flight or m.waiting:
                    continue
                m.pressure_evictions += 1
                sup.events.publish(
                    victim,
                    EventKind.PRESSURE,
                    device=ev.device,
                    free_bytes=ev.free,
                    reserve_bytes=ev.reserve,
                    growth_bytes=ev.growth,
                    pid=pid,
                    process=name,
                    process_bytes=size,
                    message=f"unloaded to yield memory on {ev.device} to {who}: {why}",
                )
                await m.unload("pressure")
        sup.record_children()


def _attributed(
    models: list[ManagedModel], held: dict[str, dict[str, int]], seen: dict[str, dict[int, ProcessMemory]]
) -> dict[str, dict[str, int]]:
    """Per model and device: what attribution saw its child hold there, else what placement
    counted for it (a source that does not see the child: NVIDIA without NVML, say)."""
    out: dict[str, dict[str, int]] = {}
    for m in models:
        pid = _pid(m)
        row = {}
        for key, planned in held[m.name].items():
            found = seen.get(key, {}).get(pid) if pid is not None else None
            row[key] = found.bytes if found is not None else planned
        out[m.name] = row
    return out


def _pid(m: ManagedModel) -> int | None:
    server = m.server
    return server.pid if server is not None and server.alive else None


def _candidate(m: ManagedModel, held: dict[str, int], now: float) -> Candidate:
    return Candidate(
        name=m.name,
        bytes_by_device=held,
        busy=bool(m.in_flight or m.waiting) or m.state != ModelState.READY,
        pinned=m.config.pinned,
        idle_seconds=max(0.0, now - m.last_used),
        load_seconds=m.load_seconds or 1.0,
    )
