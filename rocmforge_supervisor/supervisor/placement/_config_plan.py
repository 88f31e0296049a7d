"""``forge plan`` and ``GET /api/plan``: the whole config placed on this machine, without starting
anything (pure: the callers read the files and the devices, :mod:`._plan_inputs`).

For each model: where it would go, its estimate by part, the context ``ctx_size = "auto"`` would
choose, and what loading it would unload — from the state the service starts in (its ``preload``
models and the warm default, placed in config order) for a dry run, or from what a running
service holds now. Then which models cannot be loaded together: a group's ``max_loaded`` or
``exclusive``, the models the rules keep (pinned, ``swap = "never"``) and what does not fit beside
them, and pairs that do not fit together even at their smallest. A model that fits nowhere even
with nothing else loaded gets the smallest changes that would make it fit (:mod:`._fit_advice`).
Every placement here is :func:`~._placement.place`'s, the one the supervisor makes at a load.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import combinations
from typing import Literal

from ..._errors import ForgeError, PlacementError
from ...hardware import Inventory
from ...models import MemoryEstimate
from ._ctx_auto import ContextChoice
from ._fit_advice import Advice, _sized, fit_advice, fits_alone
from ._placement import _chosen, place
from ._placement_types import (
    LoadedModel,
    PlacementDecision,
    PlacementPolicy,
    PlacementRequest,
    SizedRequest,
    free_memory,
)
from ._planner import SizedPlanner
from ._residency import Residency

__all__ = ["ConfigPlan", "ModelPlan", "PlanEntry", "Together", "plan_config"]

State = Literal["loaded", "at start", "on request", "refused", "does not fit", "not planned"]


@dataclass(frozen=True)
class PlanEntry:
    """One configured model as the plan takes it: its placement request, or why there is none."""

    name: str
    backend: str = "llama"
    request: PlacementRequest | SizedRequest | None = None
    residency: Residency = field(default_factory=Residency)
    preload: bool = False
    problem: str | None = None
    """Why it cannot be planned here (its file is not downloaded yet, it goes to RPC workers)."""
    hint: str | None = None


@dataclass(frozen=True)
class ModelPlan:
    """Where one model would go, and at what cost."""

    name: str
    backend: str
    state: State
    residency: Residency
    devices: tuple[str, ...] = ()
    reason: str = ""
    estimate: MemoryEstimate | None = None
    context: ContextChoice | None = None
    evict: tuple[str, ...] = ()
    evict_rules: Mapping[str, str] = field(default_factory=dict)
    error: str | None = None
    hint: str | None = None
    fits_alone: bool = True
    """It fits this machine with no other model of forge's loaded."""
    advice: tuple[Advice, ...] = ()
    """When it does not fit (beside the models the rules keep loaded, if any): each change that
    alone would make it fit there, the smallest first."""
    note: str = ""
    """What else to know: a ``preload`` model that a later one unloads at the start."""

    def to_json(self) -> dict[str, object]:
        est = self.estimate
        return {
            "name": self.name,
            "backend": self.backend,
            "state": self.state,
            "note": self.note,
            "residency": self.residency.to_json(),
            "devices": list(self.devices),
            "reason": self.reason,
            "estimate": est.to_json() if est is not None else None,
            "ctx_size": est.ctx_size if est is not None and est.ctx_size else None,
            "ctx_per_request": est.ctx_per_request if est is not None and est.ctx_size else None,
            "context": self.context.to_json() if self.context is not None else None,
            "evict": list(self.evict),
            "evict_rules": dict(self.evict_rules),
            "error": self.error,
            "hint": self.hint,
            "fits_alone": self.fits_alone,
            "advice": [a.to_json() for a in self.advice],
        }


@dataclass(frozen=True)
class Together:
    """Models that cannot all be loaded at once, and why."""

    kind: Literal["group", "exclusive", "kept", "memory"]
    models: tuple[str, ...]
    text: str

    def to_json(self) -> dict[str, object]:
        return {"kind": self.kind, "models": list(self.models), "text": self.text}


@dataclass(frozen=True)
class DeviceRow:
    key: str
    name: str
    total_bytes: int
    free_bytes: int
    """Free now, as discovery reports it (with none of the plan's models loaded)."""
    free_beside_bytes: int
    """Free beside the models the plan starts from (the start's, or the service's now)."""

    def to_json(self) -> dict[str, object]:
        return {
            "key": self.key,
            "name": self.name,
            "total_bytes": self.total_bytes,
            "free_bytes": self.free_bytes,
            "free_beside_loaded_bytes": self.free_beside_bytes,
        }


@dataclass(frozen=True)
class ConfigPlan:
    devices: tuple[DeviceRow, ...]
    start: tuple[str, ...]
    """The models loaded in the state the plan starts from."""
    start_from: Literal["start", "running"]
    """``start``: a dry run, from the service's start (preloads, the default); ``running``: from
    what a running service holds now."""
    models: tuple[ModelPlan, ...]
    together: tuple[Together, ...]

    def to_json(self) -> dict[str, object]:
        return {
            "start_from": self.start_from,
            "devices": [d.to_json() for d in self.devices],
            "loaded": list(self.start),
            "models": [m.to_json() for m in self.models],
            "cannot_load_together": [t.to_json() for t in self.together],
        }


def _row(entry: PlanEntry, state: State, decision: PlacementDecision) -> ModelPlan:
    return ModelPlan(
        name=entry.name,
        backend=entry.backend,
        state=state,
        residency=entry.residency,
        devices=tuple(decision.devices),
        reason=decision.reason,
        estimate=decision.estimate,
        context=decision.context,
        evict=tuple(decision.evict),
        evict_rules=dict(decision.evict_rules),
    )


def _failed(entry: PlanEntry, state: State, exc: ForgeError) -> ModelPlan:
    return ModelPlan(
        name=entry.name,
        backend=entry.backend,
        state=state,
        residency=entry.residency,
        error=exc.message,
        hint=exc.hint,
    )


def _as_loaded(entry: PlanEntry, decision: PlacementDecision, t: float) -> LoadedModel:
    """A model the plan loads: its estimate held, not in discovery's counters yet."""
    return LoadedModel(
        name=entry.name,
        bytes_by_device=decision.estimated_bytes,
        devices=tuple(decision.devices),
        last_used=t,
        counted=False,
        residency=entry.residency,
    )


def _start(
    inventory: Inventory, entries: Sequence[PlanEntry], policy: PlacementPolicy
) -> tuple[list[LoadedModel], dict[str, ModelPlan], dict[str, str]]:
    """The service's start, in config order: every ``preload`` model (unloading what it must, as
    a load does), then the warm default (which never unloads anything). Also: which model
    unloaded each preload that did not stay."""
    state: list[LoadedModel] = []
    rows: dict[str, ModelPlan] = {}
    evicted_by: dict[str, str] = {}
    starting = [e for e in entries if e.preload and e.request is not None]
    starting += [e for e in entries if e.residency.default and not e.preload and e.request is not None]
    for t, e in enumerate(starting):
        assert e.request is not None
        warm = e.residency.default and not e.preload
        try:
            d = place(inventory, e.request, state, replace(policy, allow_evict=not warm, now=float(t)))
        except ForgeError as exc:
            rows[e.name] = _failed(e, "refused", exc)
            continue
        for gone in d.evict:
            evicted_by[gone] = e.name
        state = [m for m in state if m.name not in d.evict]
        state.append(_as_loaded(e, d, float(t)))
        rows[e.name] = _row(e, "at start", d)
    for name in evicted_by:  # planned again from the start's state, as its next request loads it
        rows.pop(name, None)
    return state, rows, evicted_by


def plan_config(
    inventory: Inventory,
    entries: Sequence[PlanEntry],
    policy: PlacementPolicy,
    *,
    loaded: Sequence[LoadedModel] | None = None,
    current: Mapping[str, PlacementDecision] | None = None,
) -> ConfigPlan:
    """The plan of ``entries`` on ``inventory``. ``loaded`` (and their ``current`` decisions): a
    running service's models now; None: a dry run from the service's start."""
    unloaded_by: dict[str, str] = {}
    if loaded is None:
        state, rows, unloaded_by = _start(inventory, entries, policy)
        start_from: Literal["start", "running"] = "start"
    else:
        state = list(loaded)
        by_name = {e.name: e for e in entries}
        rows = {
            m.name: _row(by_name[m.name], "loaded", (current or {})[m.name])
            for m in state
            if m.name in by_name and m.name in (current or {})
        }
        start_from = "running"
    # Free as if none of forge's models were loaded: what "fits at all" is measured against.
    bare = free_memory(inventory, [], state)
    # Free beside the models the rules keep (they never make room): where a load must fit for good.
    kept = [m for m in state if m.residency.protected]
    beside_kept = free_memory(inventory, kept, [m for m in state if m not in kept])
    now = policy.now if policy.now is not None else max((m.last_used for m in state), default=0.0) + 1
    models: list[ModelPlan] = []
    for e in entries:
        if e.problem is not None or e.request is None:
            models.append(
                ModelPlan(e.name, e.backend, "not planned", e.residency, error=e.problem, hint=e.hint)
            )
            continue
        row = rows.get(e.name)
        if row is None:
            try:
                d = place(inventory, e.request, state, replace(policy, allow_evict=True, now=now))
                row = _row(e, "on request", d)
            except ForgeError as exc:
                row = _failed(e, "refused", exc)
        if e.name in unloaded_by:
            row = replace(row, note=f"preloaded, then unloaded at the start by {unloaded_by[e.name]}")
        if row.error is not None and not _fits_at_all(inventory, e.request, policy, beside_kept):
            request = e.request
            advice = (
                fit_advice(inventory, request, policy, beside_kept)
                if isinstance(request, PlacementRequest)
                else []
            )
            alone = _fits_at_all(inventory, request, policy, bare)
            row = replace(row, state="does not fit", fits_alone=alone, advice=tuple(advice))
        models.append(row)
    together = _together(inventory, entries, policy, bare, {m.name for m in models if not m.fits_alone})
    held = free_memory(inventory, state)
    devices = tuple(
        DeviceRow(d.key, d.name, d.vram_total_bytes, d.vram_free_bytes, held.get(d.key, 0))
        for d in inventory.devices
        if d.usable
    )
    return ConfigPlan(devices, tuple(m.name for m in state), start_from, tuple(models), together)


def _fits_at_all(
    inventory: Inventory,
    request: PlacementRequest | SizedRequest,
    policy: PlacementPolicy,
    free: Mapping[str, int],
) -> bool:
    if isinstance(request, PlacementRequest):
        return fits_alone(inventory, request, policy, free)
    try:
        planner = SizedPlanner(inventory, request, _chosen(inventory, request.gpu))
    except PlacementError:
        return False
    return planner.attempt(free) is not None


def _smallest(request: PlacementRequest | SizedRequest) -> PlacementRequest | SizedRequest:
    """The least a model loads with: ``ctx_size = "auto"`` at its floor, anything else as it is."""
    return _sized(request.effective()) if isinstance(request, PlacementRequest) else request


def _together(
    inventory: Inventory,
    entries: Sequence[PlanEntry],
    policy: PlacementPolicy,
    bare: Mapping[str, int],
    nowhere: set[str],
) -> tuple[Together, ...]:
    """Which models cannot all be loaded at once: the groups' rules, what the kept models leave
    room for, and pairs that do not fit together at their smallest."""
    order = [e.name for e in entries]
    out: list[Together] = []
    for g in policy.groups.values():
        members = tuple(n for n in order if n in g.members)
        if g.max_loaded is not None and g.max_loaded < len(members):
            out.append(
                Together(
                    "group",
                    members,
                    f"group {g.name!r}: at most {g.max_loaded} of {', '.join(members)} loaded at once",
                )
            )
        if g.exclusive:
            out.append(
                Together(
                    "exclusive",
                    members,
                    f"group {g.name!r} is exclusive: loading {', '.join(members)} unloads every model "
                    "outside it but pinned and never-swap ones",
                )
            )
    plannable = [e for e in entries if e.request is not None and e.problem is None and e.name not in nowhere]
    alone = replace(policy, allow_evict=False, groups={}, max_loaded=None)
    empty = _emptied(inventory, bare)
    kept: list[tuple[PlanEntry, LoadedModel]] = []
    for e in (e for e in plannable if e.residency.protected):
        assert e.request is not None
        state = [m for _, m in kept]
        try:
            d = place(empty, _smallest(e.request), state, alone)
        except ForgeError:
            names = (*(k.name for k, _ in kept), e.name)
            out.append(
                Together(
                    "kept",
                    names,
                    f"{e.name} ({e.residency.rule}) does not fit beside "
                    + ", ".join(f"{k.name} ({k.residency.rule})" for k, _ in kept)
                    + ": the rules keep each of them loaded once it is",
                )
            )
            continue
        kept.append((e, _as_loaded(e, d, 0.0)))
    if kept:
        held = ", ".join(f"{k.name} ({k.residency.rule})" for k, _ in kept)
        verb = "stays" if len(kept) == 1 else "stay"
        for e in (e for e in plannable if not e.residency.protected):
            assert e.request is not None
            try:
                place(empty, _smallest(e.request), [m for _, m in kept], alone)
            except ForgeError as exc:
                short = _short_need(exc)
                out.append(
                    Together(
                        "kept",
                        (e.name, *(k.name for k, _ in kept)),
                        f"{e.name} cannot load while {held} {verb} loaded by rule{short}",
                    )
                )
    # Pairs that do not fit together even at their smallest (kept models are covered above).
    free_ones = [e for e in plannable if not e.residency.protected]
    single = {frozenset(m for m in g.members) for g in policy.groups.values() if g.max_loaded == 1}
    for a, b in combinations(free_ones, 2):
        if any({a.name, b.name} <= s for s in single):
            continue  # its group already keeps them apart
        if not (_pair_fits(empty, a, b, alone) or _pair_fits(empty, b, a, alone)):
            out.append(
                Together(
                    "memory",
                    (a.name, b.name),
                    f"{a.name} and {b.name} do not fit together, even at their smallest: "
                    "loading one unloads the other",
                )
            )
    return tuple(out)


def _pair_fits(inventory: Inventory, first: PlanEntry, second: PlanEntry, policy: PlacementPolicy) -> bool:
    assert first.request is not None and second.request is not None
    try:
        d = place(inventory, _smallest(first.request), [], policy)
        place(inventory, _smallest(second.request), [_as_loaded(first, d, 0.0)], policy)
    except ForgeError:
        return False
    return True


def _emptied(inventory: Inventory, bare: Mapping[str, int]) -> Inventory:
    """``inventory`` with none of forge's models in its counters: each device's free is ``bare``."""
    devices = tuple(
        replace(d, vram_used_bytes=max(0, d.vram_total_bytes - bare[d.key])) if d.key in bare else d
        for d in inventory.devices
    )
    return replace(inventory, devices=devices)


def _short_need(exc: ForgeError) -> str:
    """``: it needs 6.1 GiB on amd:0 …`` from a refusal, when it says so in one clause."""
    text = exc.message
    cut = text.find(" needs ")
    if cut < 0:
        return ""
    return ": it" + text[cut:].split(";")[0]
