"""From a load request to a placement decision: the bridge between callers and the pure placer.

Placement itself (``_placement.place``) is a pure function of (inventory, request, loaded set).
This module builds those inputs from a model's GGUF metadata, its load options and what the
supervisor has running, and turns the answer into what the spawn needs.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ..hardware import Inventory
from ..settings import ForgeSettings

__all__ = ["DeviceDecision", "decide_devices", "decide_for_service", "new_allocation_tracker"]


@dataclass
class DeviceDecision:
    devices: list[str]
    n_gpu_layers: int | str | None = None
    tensor_split: list[float] | None = None
    evict: list[str] = field(default_factory=list)
    estimate: Any = None
    estimated_bytes: dict[str, int] = field(default_factory=dict)


def _gpu_request(gpu: Any) -> Any:
    if isinstance(gpu, str):
        g = gpu.strip().lower()
        if g in ("auto", "cpu"):
            return g
        if g.isdigit():
            return int(g)
    return gpu


def decide_devices(
    info: Any,
    options: Any,
    inventory: Inventory,
    settings: ForgeSettings,
    loaded: Iterable[Any] = (),
    *,
    name: str = "",
    allow_evict: bool = False,
) -> DeviceDecision:
    from ._placement import PlacementPolicy, PlacementRequest, place

    request = PlacementRequest(
        name=name or "model",
        info=info,
        gpu=_gpu_request(getattr(options, "gpu", "auto")),
        ctx_size=getattr(options, "ctx_size", None),
        parallel=getattr(options, "parallel", None),
        n_gpu_layers=getattr(options, "n_gpu_layers", None),
        extra_args=tuple(getattr(options, "args", ()) or ()),
    )
    decision = place(inventory, request, list(loaded), PlacementPolicy(allow_evict=allow_evict))
    return DeviceDecision(
        devices=list(decision.devices),
        n_gpu_layers=decision.n_gpu_layers,
        tensor_split=list(decision.tensor_split) if decision.tensor_split else None,
        evict=list(decision.evict),
        estimate=decision.estimate,
        estimated_bytes=dict(decision.estimated_bytes),
    )


def decide_for_service(
    model: Any, info: Any, inventory: Inventory, settings: ForgeSettings, models: Iterable[Any]
) -> DeviceDecision:
    """Placement for a supervised model, counting what the other running models hold."""
    from ._placement import LoadedModel

    loaded = []
    for other in models:
        if other is model or other.prepared is None or not other.running:
            continue
        held = dict(other.prepared.estimated_bytes)
        actual = other.prepared.actual
        if actual:
            held = {**held, **actual.device_totals()}
        loaded.append(
            LoadedModel(
                name=other.name,
                devices=tuple(other.prepared.devices),
                bytes_by_device=held,
                in_flight=other.in_flight + other.waiting,
                last_used=other.last_used,
            )
        )

    class _Opts:
        gpu = getattr(model.config, "gpu", "auto")
        ctx_size = getattr(model.config, "ctx_size", None)
        parallel = getattr(model.config, "parallel", None)
        n_gpu_layers = getattr(model.config, "gpu_layers", None)
        args = getattr(model.config, "args", ())

    return decide_devices(info, _Opts(), inventory, settings, loaded, name=model.name, allow_evict=True)


def new_allocation_tracker() -> Any:
    """A ledger fed with every log line of the child: what it really allocated, per device."""
    from ..models._allocations import AllocationLedger

    return AllocationLedger()
