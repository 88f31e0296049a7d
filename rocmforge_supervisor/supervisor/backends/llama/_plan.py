"""The launch pipeline of a llama-server model, run by the supervisor under its placement lock:
resolve (the GGUF, blocking: off the loop), decide here (:func:`~._evicting.place_here`, as
every backend does: evicting idle models when it must) or on RPC workers, build the plan (:mod:`._launch` holds the three steps; this module carries them out
with the supervisor's state, through the narrow :class:`~._host.PlacementHost`).
"""

from __future__ import annotations

import logging
from pathlib import Path

import anyio

from ...._errors import PlacementError, ResidencyBusy, ResidencyConflict
from ....hardware import Inventory, discover_workers
from ...launch._launch import (
    LaunchPlan,
    ModelSpec,
    ResolvedModel,
    build_plan,
    decide_on_workers,
    placement_request,
    resolve,
)
from ...placement._placement import PlacementDecision
from .._evicting import place_here
from .._host import HostedModel, PlacementHost

__all__ = ["plan_llama"]

log = logging.getLogger("rocmforge.supervisor")

#: Seconds an RPC worker may take to answer the device probe (a held one never answers).
_WORKER_PROBE_TIMEOUT = 10.0


async def plan_llama(host: PlacementHost, m: HostedModel) -> LaunchPlan:
    spec = ModelSpec.from_config(m.config, workers_configured=bool(host.workers), defaults=host.policy)
    slot_dir = host.keeper(m.name).slot_dir() if m.config.keep_context else None
    # Resolving may download (hf:), inspecting reads the GGUF: not on the event loop.
    model = await anyio.to_thread.run_sync(resolve, spec, host.settings)
    async with host.placement_lock:
        decision, inventory = await _decide(host, m, spec, model)
    if decision.context is not None:  # ctx_size = "auto": chosen again at every load
        log.info("model %s: ctx_size auto: %s", m.name, decision.context.describe(), extra={"model": m.name})
    return build_plan(
        spec,
        m.name,
        model,
        decision,
        inventory,
        host.settings,
        binary=host.binary or Path("llama-server"),
        binary_args=host.binary_args,
        log_path=host.log_dir / f"{m.name}.log",
        state_dir=host.state_dir,
        stall_timeout=host.policy.load_stall_timeout,
        ready_timeout=host.policy.load_deadline(model.info.file_size_bytes),
        stop_timeout=host.policy.stop_timeout,
        line_listeners=[host.log_forwarder(m.name)],
        slot_save_dir=slot_dir,
    )


async def _decide(
    host: PlacementHost, m: HostedModel, spec: ModelSpec, model: ResolvedModel
) -> tuple[PlacementDecision, Inventory]:
    """Here (evicting idle models if it must), or on RPC workers when the spec says so or
    (``auto``) when it does not fit here."""
    if spec.workers in ("only", "all"):
        inventory = await host.refresh_inventory()
        return await _decide_on_workers(host, m, spec, model), inventory
    try:
        return await place_here(host, m, placement_request(spec, m.name, model, host.binary_args))
    except (ResidencyConflict, ResidencyBusy):
        raise  # the rules decided, not the memory: RPC workers would not change it
    except PlacementError:
        if spec.workers == "never" or m.warming:
            raise
        inventory = await host.refresh_inventory()
        return await _decide_on_workers(host, m, spec, model), inventory


async def _decide_on_workers(
    host: PlacementHost, m: HostedModel, spec: ModelSpec, model: ResolvedModel
) -> PlacementDecision:
    """Probe the configured workers no other model holds, then plan on them (pure)."""
    held = {
        w.worker
        for o in host.models.values()
        if o is not m and o.running and o.plan is not None
        for w in o.plan.workers
    }
    free = [w.address for w in host.workers if w.address not in held]
    binary = host.binary or Path("llama-server")
    reports = await anyio.to_thread.run_sync(
        lambda: discover_workers(binary, free, timeout=_WORKER_PROBE_TIMEOUT)
    )
    return decide_on_workers(spec, m.name, model, reports, held)
