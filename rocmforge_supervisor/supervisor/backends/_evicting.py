"""Carrying out what placement and the residency rules decided: unloading the chosen models.

Every backend's launch pipeline places its model through :func:`place_here`, under the
supervisor's placement lock: the fresh inventory, what the other models hold, the rules and the
clock go to the one pure :func:`~._placement.place`, and the models it chose are unloaded, so
that an ``evict`` event always names the model it made room for and the rule that chose it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

import anyio

from ...hardware import Inventory
from .._events import EventKind
from ..placement._placement import (
    LoadedModel,
    PlacementDecision,
    PlacementPolicy,
    PlacementRequest,
    SizedRequest,
    place,
)
from ._host import HostedModel, PlacementHost

__all__ = ["evict", "loaded_others", "place_here"]

#: After an eviction: how long to wait for the driver to hand the memory back (Ollama waits 5 s).
_RELEASE_TIMEOUT = 5.0
_RELEASE_POLL = 0.25


def loaded_others(host: PlacementHost, m: HostedModel) -> list[LoadedModel]:
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


async def place_here(
    host: PlacementHost, m: HostedModel, request: PlacementRequest | SizedRequest
) -> tuple[PlacementDecision, Inventory]:
    """Where ``m`` goes now, with the models it displaces unloaded; the caller holds the placement
    lock. A warm start (the default, loaded without a request) never unloads another model.
    Raises what :func:`~._placement.place` raises: :class:`~.._errors.ResidencyConflict` (a rule
    forbids it), :class:`~.._errors.ResidencyBusy` (its group's members are busy),
    :class:`~.._errors.PlacementError` (it does not fit)."""
    inventory = await host.refresh_inventory()
    loaded = loaded_others(host, m)
    # Read from the measurements file: off the event loop.
    contexts = await anyio.to_thread.run_sync(host.device_contexts.for_devices, inventory.devices)
    policy = PlacementPolicy(
        allow_evict=not m.warming,
        device_context=contexts,
        groups=dict(host.groups),
        now=time.monotonic(),
    )
    decision = place(inventory, request, loaded, policy)
    if decision.evict:
        inventory = await evict(host, decision, for_model=m.name)
    return decision, inventory


def _free_by_device(inventory: Inventory) -> dict[str, int]:
    return {d.key: d.vram_free_bytes for d in inventory.devices if d.usable}


def _short(free: Mapping[str, int], need: Mapping[str, int]) -> dict[str, int]:
    """Per device: the bytes still missing."""
    return {k: v - free.get(k, 0) for k, v in need.items() if free.get(k, 0) < v}
