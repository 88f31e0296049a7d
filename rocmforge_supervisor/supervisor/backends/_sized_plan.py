"""The launch pipeline of a model placed by a size it is given: a whisper model (its file plus
whisper.cpp's state), a ``backend = "command"`` model (its ``memory``).

The backend resolves what it runs (a :class:`SizedChild`: the request placement sizes, the model's
info, the binary, its :class:`~..process.ServerProgram`); this places it under the placement lock
the way every model is placed (:func:`~._evicting.place_here`: idle models evicted for room, the
residency rules, the refusals) and builds its :class:`~..process.InstanceSpec`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ...hardware import child_env
from ...models import AllocationLedger, GGUFInfo
from ...process import InstanceSpec, ServerProgram
from ..launch._launch import LaunchPlan
from ..placement._placement_types import SizedRequest
from ._evicting import place_here
from ._host import HostedModel, PlacementHost

__all__ = ["LedgerFeed", "SizedChild", "plan_sized"]

#: Makes the listener that reads a child's own allocation lines into the plan's ledger, given the
#: GPU keys it was placed on (None: the CPU).
LedgerFeed = Callable[[AllocationLedger, Sequence[str] | None], Callable[[str], object]]


@dataclass(frozen=True)
class SizedChild:
    """What a backend of given-size models resolved for one start."""

    request: SizedRequest
    info: GGUFInfo
    """What the status and the listings show; its ``path`` is the child's model path."""
    binary: Path
    program: ServerProgram
    ledger_feed: LedgerFeed | None = None
    """None: the child prints no allocation lines forge reads; its size stays the request's."""


async def plan_sized(host: PlacementHost, m: HostedModel, child: SizedChild) -> LaunchPlan:
    """The supervisor's plan for a given-size model: placed (and room made) under the lock."""
    async with host.placement_lock:
        decision, inventory = await place_here(host, m, child.request)
    devices = [inventory.by_key(k) for k in decision.devices]
    gpus = [k for k in decision.devices if k != "cpu"]
    ledger = AllocationLedger(gpu_keys=gpus or None)
    feeds = [child.ledger_feed(ledger, gpus or None)] if child.ledger_feed is not None else []
    spec = InstanceSpec(
        binary=child.binary,
        model_path=child.info.path,
        alias=m.name,
        extra_args=list(m.config.args),
        # Neither whisper-server nor a program forge does not know takes forge's key file: the child
        # listens on loopback only and the gateway's keys guard it.
        api_key="",
        mask=child_env(devices, inventory, host.settings),
        cpu_only=decision.on_cpu,
        log_path=host.log_dir / f"{m.name}.log",
        state_dir=host.state_dir,
        stall_timeout=host.policy.load_stall_timeout,
        ready_timeout=host.policy.load_deadline(child.info.file_size_bytes),
        stop_timeout=host.policy.stop_timeout,
        line_listeners=[*feeds, host.log_forwarder(m.name)],
        program=child.program,
    )
    return LaunchPlan(
        spec=spec, decision=decision, model_path=child.info.path, info=child.info, actual=ledger
    )
