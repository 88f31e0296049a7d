"""Where a model goes: a pure decision over (inventory, request, what is loaded, policy).

Nothing here touches a process, a file or a clock: the supervisor gathers the facts, calls
:func:`place`, then carries the decision out (unload ``evict``, wait for the memory, spawn with
``devices``, ``n_gpu_layers``, ``tensor_split``).

The ladder: one GPU with the whole model; else a tensor split over the
fewest GPUs (of one vendor) that hold it; else, when the policy allows, a partial offload (as
many layers as fit); the CPU when there is no GPU (or when the policy allows falling back to
it). When none fits, idle models are evicted, least recently used first, never one with
requests in flight, and only as many as needed. Otherwise :class:`PlacementError` names what the
model needs, what each device has free, and what to change.

Free memory on a device is what discovery reported, minus what our own children hold but the
counters do not show yet (a model still loading, or an inventory taken before it loaded), and
never more than the total minus everything our children hold (Ollama's rule).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

from .._errors import PlacementError
from ..config import GpuChoice, GpuRef
from ..hardware import Device, Inventory
from ._placement_types import (
    LoadedModel,
    PlacementDecision,
    PlacementPolicy,
    PlacementRequest,
    describe_device,
    free_memory,
)
from ._planner import Layout, Planner
from ._refusal import refusal

__all__ = [
    "LoadedModel",
    "PlacementDecision",
    "PlacementPolicy",
    "PlacementRequest",
    "free_memory",
    "place",
]

# -- choosing devices ------------------------------------------------------------------------------


def _resolve_gpu(inventory: Inventory, spec: GpuRef) -> Device:
    gpus_all = [d for d in inventory.devices if d.vendor != "cpu"]
    if not isinstance(spec, int):  # a device key (parse_gpu made it: lower-case, no spaces)
        try:
            dev = inventory.by_key(spec)
        except KeyError:
            dev = None
        if dev is None or dev.vendor == "cpu":
            raise PlacementError(
                f"no GPU {spec!r} on this machine",
                hint=f"GPUs: {', '.join(describe_device(d) for d in gpus_all) or 'none'}; or use gpu=auto / cpu",
            )
    else:
        index = spec
        matches = [d for d in gpus_all if d.index == index]
        if not matches:
            raise PlacementError(
                f"no GPU {index} on this machine",
                hint=f"GPUs: {', '.join(describe_device(d) for d in gpus_all) or 'none'}; or use gpu=auto / cpu",
            )
        if len(matches) > 1:
            raise PlacementError(
                f"GPU {index} is ambiguous here ({', '.join(describe_device(d) for d in matches)})",
                hint="name it by key, e.g. gpu=" + matches[0].key,
            )
        dev = matches[0]
    if not dev.usable:
        raise PlacementError(
            f"GPU {describe_device(dev)} is not usable: {dev.skip_reason or 'excluded by discovery'}",
            hint="choose another GPU, or gpu=auto",
        )
    return dev


def _chosen(inventory: Inventory, gpu: GpuChoice) -> list[Device] | Literal["auto", "cpu"]:
    """The devices ``gpu`` names. It was parsed once (``parse_gpu``): here it is only matched."""
    if gpu == "auto":
        return "auto"
    if gpu == "cpu":
        return "cpu"
    if not isinstance(gpu, list):
        return [_resolve_gpu(inventory, gpu)]
    devices = [_resolve_gpu(inventory, g) for g in gpu]
    if not devices:
        return "auto"
    if len({d.key for d in devices}) != len(devices):
        raise PlacementError(f"GPU list {list(gpu)} names a GPU twice", hint="name each GPU once")
    if len({d.vendor for d in devices}) > 1:
        raise PlacementError(
            f"GPU list {list(gpu)} mixes vendors", hint="one llama-server uses the GPUs of one vendor"
        )
    return sorted(devices, key=lambda d: d.index)


# -- the decision ----------------------------------------------------------------------------------


def place(
    inventory: Inventory,
    request: PlacementRequest,
    loaded: Sequence[LoadedModel],
    policy: PlacementPolicy | None = None,
) -> PlacementDecision:
    """Decide where ``request`` goes and what must be unloaded first; or raise PlacementError."""
    policy = policy or PlacementPolicy()
    request = request.effective()
    planner = Planner(inventory, request, policy)
    choice = _chosen(inventory, request.gpu)
    others = [m for m in loaded if m.name != request.name]

    def attempt(free: Mapping[str, int]) -> Layout | None:
        if choice == "auto":
            return planner.auto(free)
        if choice == "cpu":
            return planner.cpu(free)
        return planner.explicit(choice, free)

    idle = sorted((m for m in others if m.in_flight == 0), key=lambda m: (m.last_used, m.name))
    forced = _forced_evictions(request, others, idle, policy)
    evicted = list(forced)
    layout = attempt(free_memory(inventory, [m for m in others if m not in evicted], evicted))
    if layout is None and policy.allow_evict:
        for m in idle:
            if m in evicted:
                continue
            evicted.append(m)
            layout = attempt(free_memory(inventory, [x for x in others if x not in evicted], evicted))
            if layout is not None:
                break
        if layout is not None:
            # Keep only the evictions the layout needs: try sparing each, most recent first.
            for m in reversed(evicted[len(forced) :]):
                trial = [x for x in evicted if x is not m]
                spared = attempt(free_memory(inventory, [x for x in others if x not in trial], trial))
                if spared is not None:
                    evicted, layout = trial, spared
    if layout is None:
        raise refusal(inventory, request, others, policy, planner, choice)

    need = planner.need(layout)
    return PlacementDecision(
        devices=layout.gpus or ("cpu",),
        n_gpu_layers=layout.n_gpu_layers,
        tensor_split=list(layout.split) if layout.split and len(layout.gpus) > 1 else None,
        evict=[m.name for m in evicted],
        estimate=layout.estimate,
        need_bytes=need,
        reason=_reason(inventory, layout),
    )


def _forced_evictions(
    request: PlacementRequest, others: Sequence[LoadedModel], idle: list[LoadedModel], policy: PlacementPolicy
) -> list[LoadedModel]:
    """The idle models that must go whatever the memory says: the policy's cap on loaded models."""
    if policy.max_loaded is None or len(others) < policy.max_loaded:
        return []
    excess = len(others) - policy.max_loaded + 1
    if not policy.allow_evict or len(idle) < excess:
        raise PlacementError(
            f"{request.name} cannot be loaded: {len(others)} models are loaded (at most "
            f"{policy.max_loaded}) and {'eviction is off' if not policy.allow_evict else 'too few are idle'}",
            hint="unload a model, or raise the limit of loaded models",
        )
    return idle[:excess]


def _reason(inventory: Inventory, layout: Layout) -> str:
    if not layout.gpus:
        return "on the CPU"
    names = ", ".join(describe_device(inventory.by_key(k)) for k in layout.gpus)
    if layout.kind == "partial offload":
        total = sum(d.layers for d in layout.estimate.devices) + 1
        return f"partial offload: {layout.n_gpu_layers} of {total} layers on {names}"
    return f"{layout.kind}: {names}"
