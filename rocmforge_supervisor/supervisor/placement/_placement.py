"""Where a model goes: a pure decision over (inventory, request, what is loaded, policy).

Nothing here touches a process, a file or a clock: the supervisor gathers the facts, calls
:func:`place`, then carries the decision out (unload ``evict``, wait for the memory, spawn with
``devices``, ``n_gpu_layers``, ``tensor_split``).

Every backend is placed here. A GGUF model (:class:`PlacementRequest`, llama-server) climbs the
ladder below; a model of a given size (:class:`SizedRequest`: a whisper model, a command's
``memory``) takes the devices its ``gpu`` names (``auto``: the GPU with the most free memory that
holds it, else the CPU). Evictions, the residency rules and the refusals are the same for both.

The ladder: one GPU with the whole model; else a tensor split over the
fewest GPUs (of one vendor) that hold it; else, when the policy allows, a partial offload (as
many layers as fit); the CPU when there is no GPU (or when the policy allows falling back to
it). When none fits, idle models are evicted, the highest idle seconds per ``evict_cost`` first,
never one with requests in flight, never a pinned or never-swap one (``_residency``), and only as
many as needed; a group's rules may unload members (``max_loaded``) or outsiders (``exclusive``)
first. When only pinned or never-swap models stand in the way: :class:`ResidencyConflict`. Otherwise :class:`PlacementError` names what the
model needs, what each device has free, and what to change.

``ctx_size = "auto"`` (a request with ``ctx_min``): the devices are the ones the ladder picks at
the floor, and the context is then the largest that fits them beside what stays loaded (pinned,
never-swap and busy models; every model for a load that may not evict) and the reserve, capped by
the trained context (:mod:`._ctx_auto`); the rest of the decision is made at that context. The
decision carries the choice (``context``).

Free memory on a device is what discovery reported, minus what our own children hold but the
counters do not show yet (a model still loading, or an inventory taken before it loaded), and
never more than the total minus everything our children hold (Ollama's rule).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Literal, Protocol

from ..._errors import PlacementError, ResidencyConflict
from ..._units import format_bytes
from ...config import GpuChoice, GpuRef
from ...hardware import Device, Inventory
from ._ctx_auto import ContextChoice, choose_context, context_floor, slots_of
from ._placement_types import (
    LoadedModel,
    PlacementDecision,
    PlacementPolicy,
    PlacementRequest,
    SizedRequest,
    describe_device,
    free_memory,
)
from ._planner import Layout, Planner, SizedPlanner
from ._refusal import refusal, sized_refusal
from ._residency import eviction_order, group_evictions

__all__ = [
    "LoadedModel",
    "PlacementDecision",
    "PlacementPolicy",
    "PlacementRequest",
    "SizedRequest",
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


class _Fit(Protocol):
    """What :func:`place` asks of one request's planner; the rest of the decision is the same for
    every backend."""

    def attempt(self, free: Mapping[str, int]) -> Layout | None:
        """The layout that fits in ``free``, or None."""
        ...

    def need(self, layout: Layout) -> dict[str, int]:
        """Per device: what must be free for ``layout``."""
        ...

    def refusal(self, others: Sequence[LoadedModel]) -> PlacementError:
        """Why it fits nowhere, even with every evictable model gone."""
        ...

    def reason(self, layout: Layout) -> str:
        """Why it went there, in words (``forge load`` and ``forge ps`` show it)."""
        ...


class _Ladder:
    """A GGUF model: one GPU, a split, a partial offload or the CPU (:class:`Planner`)."""

    def __init__(self, inventory: Inventory, request: PlacementRequest, policy: PlacementPolicy) -> None:
        self.inventory, self.request, self.policy = inventory, request, policy
        self.planner = Planner(inventory, request, policy)
        self.choice = _chosen(inventory, request.gpu)

    def attempt(self, free: Mapping[str, int]) -> Layout | None:
        if self.choice == "auto":
            return self.planner.auto(free)
        if self.choice == "cpu":
            return self.planner.cpu(free)
        return self.planner.explicit(self.choice, free)

    def need(self, layout: Layout) -> dict[str, int]:
        return self.planner.need(layout)

    def refusal(self, others: Sequence[LoadedModel]) -> PlacementError:
        return refusal(self.inventory, self.request, others, self.policy, self.planner, self.choice)

    def reason(self, layout: Layout) -> str:
        return _reason(self.inventory, layout)

    def target(self, free: Mapping[str, int]) -> Layout:
        """The layout a refusal measures against: on the GPU with the most free memory of those
        it may use (the whole model, as asked), else the CPU."""
        choice = self.choice
        gpus: list[Device] = (
            list(self.inventory.gpus) if choice == "auto" else [] if choice == "cpu" else choice
        )
        if not gpus or self.request.n_gpu_layers == 0:
            return self.planner.layout((), 0, None, "cpu")
        best = max(gpus, key=lambda d: free.get(d.key, 0))
        return self.planner.layout((best.key,), self.request.n_gpu_layers, None, "one GPU")


class _Sized:
    """A model of a given size on the devices its ``gpu`` names (:class:`SizedPlanner`)."""

    def __init__(self, inventory: Inventory, request: SizedRequest, policy: PlacementPolicy) -> None:
        self.inventory, self.request, self.policy = inventory, request, policy
        self.planner = SizedPlanner(inventory, request, _chosen(inventory, request.gpu))

    def attempt(self, free: Mapping[str, int]) -> Layout | None:
        return self.planner.attempt(free)

    def need(self, layout: Layout) -> dict[str, int]:
        return self.planner.need(layout)

    def refusal(self, others: Sequence[LoadedModel]) -> PlacementError:
        return sized_refusal(self.inventory, self.request, others, self.policy, self.planner)

    def reason(self, layout: Layout) -> str:
        r = self.request
        devices = layout.gpus or ("cpu",)
        each = " per device" if len(devices) > 1 else ""
        size = [f"{format_bytes(r.need_bytes)}{each}"] if r.need_bytes else []
        said = ", ".join([*size, *([r.size_note] if r.size_note else [])])
        return f"{r.what} on {', '.join(devices)}" + (f" ({said})" if said else "")


def _fit_for(inventory: Inventory, request: PlacementRequest | SizedRequest, policy: PlacementPolicy) -> _Fit:
    if isinstance(request, SizedRequest):
        return _Sized(inventory, request, policy)
    return _Ladder(inventory, request.effective(), policy)


def place(
    inventory: Inventory,
    request: PlacementRequest | SizedRequest,
    loaded: Sequence[LoadedModel],
    policy: PlacementPolicy | None = None,
) -> PlacementDecision:
    """Decide where ``request`` goes and what must be unloaded first; or raise PlacementError
    (:class:`ResidencyConflict` when only the rules stand in the way)."""
    policy = policy or PlacementPolicy()
    name = request.name
    others = [m for m in loaded if m.name != name]

    now = policy.now if policy.now is not None else max((m.last_used for m in others), default=0.0)
    rules = group_evictions(name, others, policy.groups, now)
    forced, why = _forced_evictions(name, others, policy, now)
    for m, ev in rules:
        if m not in forced:
            forced.append(m)
            why[m.name] = ev.rule
    if forced and not policy.allow_evict:
        raise PlacementError(
            f"{name} would unload {', '.join(m.name for m in forced)} ({why[forced[0].name]})",
            hint="load it when they are unloaded",
        )
    context: ContextChoice | None = None
    if isinstance(request, PlacementRequest) and (effective := request.effective()).ctx_min is not None:
        request, context = _auto_context(inventory, effective, others, policy)
    fit = _fit_for(inventory, request, policy)
    attempt = fit.attempt
    idle = eviction_order([m for m in others if m.in_flight == 0 and m not in forced], now)
    evicted = list(forced)
    layout = attempt(free_memory(inventory, [m for m in others if m not in evicted], evicted))
    if layout is None and policy.allow_evict:
        for m in idle:
            evicted.append(m)
            layout = attempt(free_memory(inventory, [x for x in others if x not in evicted], evicted))
            if layout is not None:
                break
        if layout is not None:
            # Keep only the evictions the layout needs: try sparing each, the last chosen first.
            for m in reversed(evicted[len(forced) :]):
                trial = [x for x in evicted if x is not m]
                spared = attempt(free_memory(inventory, [x for x in others if x not in trial], trial))
                if spared is not None:
                    evicted, layout = trial, spared
    if layout is None:
        if policy.allow_evict:
            _refuse_for_protected(inventory, name, others, evicted, fit)
        raise fit.refusal(others)

    return PlacementDecision(
        devices=layout.gpus or ("cpu",),
        n_gpu_layers=layout.n_gpu_layers,
        tensor_split=list(layout.split) if layout.split and len(layout.gpus) > 1 else None,
        evict=[m.name for m in evicted],
        estimate=layout.estimate,
        need_bytes=fit.need(layout),
        reason=fit.reason(layout),
        evict_rules={m.name: why.get(m.name, _MEMORY_RULE) for m in evicted},
        context=context,
    )


def _auto_context(
    inventory: Inventory, request: PlacementRequest, others: Sequence[LoadedModel], policy: PlacementPolicy
) -> tuple[PlacementRequest, ContextChoice]:
    """``ctx_size = "auto"``: the request at the largest context that fits the devices it goes to
    beside what stays loaded (pinned, never-swap and busy models; every model when this load may
    not evict), capped by the trained context. The devices are the ones placement picks at the
    floor (``ctx_min``); the context then grows on them alone."""
    assert request.ctx_min is not None
    staying = [m for m in others if not policy.allow_evict or m.in_flight > 0 or m.residency.protected]
    gone = [m for m in others if m not in staying]
    budget = free_memory(inventory, staying, gone)
    trained = request.info.context_length
    unified = request.kv_unified is not False
    parallel = request.parallel if request.parallel and request.parallel > 0 else 4
    floor = context_floor(request.ctx_min, trained) * slots_of(parallel, unified)
    ladder = _Ladder(inventory, replace(request, ctx_size=floor, ctx_min=None), policy)
    shape = ladder.attempt(budget)
    if shape is None:
        if policy.allow_evict:  # only the rules' models stand in the way: the 409 that names them
            _refuse_for_protected(inventory, request.name, others, gone, ladder)
        shape = ladder.target(budget)

    def need_at(ctx_size: int) -> dict[str, int] | None:
        planner = Planner(inventory, replace(request, ctx_size=ctx_size, ctx_min=None), policy)
        layout = planner.same_shape(shape, budget)
        return planner.need(layout) if layout is not None else None

    beside = ", ".join(
        f"{m.name} ({m.residency.rule if m.residency.protected else 'busy' if m.in_flight else 'loaded'})"
        for m in staying
    )
    choice = choose_context(
        need_at,
        budget,
        trained=trained,
        ctx_min=request.ctx_min,
        parallel=parallel,
        unified=unified,
        name=request.name,
        beside=beside,
    )
    return replace(request, ctx_size=choice.ctx_size, ctx_min=None), choice


#: The rule an eviction for room names (the others name their group or ``max_loaded``).
_MEMORY_RULE = "memory: the idle model with the highest idle seconds / evict_cost"


def _refuse_for_protected(
    inventory: Inventory,
    name: str,
    others: Sequence[LoadedModel],
    evicted: Sequence[LoadedModel],
    fit: _Fit,
) -> None:
    """When only models the rules keep (pinned, never-swap) stand in the way: a
    :class:`ResidencyConflict` naming them and the memory missing — waiting cannot fix it."""
    protected = [m for m in others if m.residency.protected and m not in evicted]
    if not protected:
        return
    attempt = fit.attempt
    gone = [*evicted, *protected]
    layout = attempt(free_memory(inventory, [x for x in others if x not in gone], gone))
    if layout is None:
        return  # it does not fit even then: the memory refusal says what it needs
    # The fewest protected models it would take (the biggest first), for the message.
    holders: list[LoadedModel] = []
    for m in sorted(protected, key=lambda m: -sum(m.bytes_by_device.values())):
        holders.append(m)
        trial = [*evicted, *holders]
        if attempt(free_memory(inventory, [x for x in others if x not in trial], trial)) is not None:
            break
    free = free_memory(inventory, [x for x in others if x not in evicted], evicted)
    need = fit.need(layout)
    short = {k: v - free.get(k, 0) for k, v in need.items() if v > free.get(k, 0)}
    missing = "; ".join(
        f"{format_bytes(v)} more on {describe_device(inventory.by_key(k))} "
        f"(needs {format_bytes(need[k])}, {format_bytes(max(0, free.get(k, 0)))} free)"
        for k, v in short.items()
    )
    held = ", ".join(
        f"{m.name} ({m.residency.rule}, {format_bytes(sum(m.bytes_by_device.values()))})" for m in holders
    )
    first = holders[0]
    rule = first.residency.rule
    undo = "pinned = false" if first.residency.pinned else 'swap = "auto"'
    verb = "stays" if len(holders) == 1 else "stay"
    raise ResidencyConflict(
        f"{name} does not fit while {held} {verb} loaded by rule: it needs {missing}",
        rule=rule,
        hint=f"unload {first.name} yourself (`forge unload {first.name}`), or set {undo} on it",
    )


def _forced_evictions(
    name: str, others: Sequence[LoadedModel], policy: PlacementPolicy, now: float
) -> tuple[list[LoadedModel], dict[str, str]]:
    """The idle models that must go whatever the memory says: the policy's cap on loaded models."""
    if policy.max_loaded is None or len(others) < policy.max_loaded:
        return [], {}
    excess = len(others) - policy.max_loaded + 1
    idle = eviction_order([m for m in others if m.in_flight == 0], now)
    if not policy.allow_evict or len(idle) < excess:
        raise PlacementError(
            f"{name} cannot be loaded: {len(others)} models are loaded (at most "
            f"{policy.max_loaded}) and {'eviction is off' if not policy.allow_evict else 'too few are idle'}",
            hint="unload a model, or raise the limit of loaded models",
        )
    rule = f"at most {policy.max_loaded} models loaded"
    return idle[:excess], {m.name: rule for m in idle[:excess]}


def _reason(inventory: Inventory, layout: Layout) -> str:
    if not layout.gpus:
        return "on the CPU"
    names = ", ".join(describe_device(inventory.by_key(k)) for k in layout.gpus)
    if layout.kind == "partial offload":
        total = sum(d.layers for d in layout.estimate.devices) + 1
        return f"partial offload: {layout.n_gpu_layers} of {total} layers on {names}"
    return f"{layout.kind}: {names}"
