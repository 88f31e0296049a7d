"""Carrying out what placement and the residency rules decided: unloading the chosen models.

Every backend's launch pipeline runs these under the supervisor's placement lock, so that an
``evict`` event always names the model it made room for and the rule that chose it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

import anyio

from .._errors import PlacementError
from ..hardware import Inventory
from ._events import EventKind
from ._host import PlacementHost
from ._placement import LoadedModel, PlacementDecision
from ._residency import group_evictions

if TYPE_CHECKING:
    from ._managed import ManagedModel

__all__ = ["evict", "evict_by_group", "loaded_others"]

#: After an eviction: how long to wait for the driver to hand the memory back (Ollama waits 5 s).
_RELEASE_TIMEOUT = 5.0
_RELEASE_POLL = 0.25


def loaded_others(host: PlacementHost, m: ManagedModel) -> list[LoadedModel]:
    """Every other model that holds memory now, as placement counts it."""
    return [lm for o in host.models.values() if o is not m and (lm := o.as_loaded()) is not None]


async def _unload(host: PlacementHost, victims: Mapping[str, str], for_model: str) -> None:
    for victim, rule in victims.items():
        other = host.models.get(victim)
        if other is not None:
            host.events.publish(victim, EventKind.EVICT, for_model=for_model, rule=rule)
            await other.unload("evicted")


async def evict(host: PlacementHost, decision: PlacementDecision, *, for_model: str) -> Inventory:
    """Unload what placement chose, then wait (bounded) until the drivers hand the memory back."""
    await _unload(host, {v: decision.evict_rules.get(v, "memory") for v in decision.evict}, for_model)
    with anyio.move_on_after(_RELEASE_TIMEOUT):
        # Polled: the drivers' counters change with no event to wait on.
        while _short(_free_by_device(await host.refresh_inventory()), decision.need_bytes):  # noqa: ASYNC110
            await anyio.sleep(_RELEASE_POLL)
    return await host.refresh_inventory()


async def evict_by_group(host: PlacementHost, m: ManagedModel) -> None:
    """For a backend whose size forge does not place by (whisper, a command): its group's rules
    alone (``max_loaded``, ``exclusive``). Raises like :func:`~._residency.group_evictions`."""
    chosen = group_evictions(m.name, loaded_others(host, m), host.groups, time.monotonic())
    if chosen and m.warming:
        raise PlacementError(f"{m.name} would unload {', '.join(e.name for _, e in chosen)}")
    await _unload(host, {e.name: e.rule for _, e in chosen}, m.name)


def _free_by_device(inventory: Inventory) -> dict[str, int]:
    return {d.key: d.vram_free_bytes for d in inventory.devices if d.usable}


def _short(free: Mapping[str, int], need: Mapping[str, int]) -> dict[str, int]:
    """Per device: the bytes still missing."""
    return {k: v - free.get(k, 0) for k, v in need.items() if free.get(k, 0) < v}
