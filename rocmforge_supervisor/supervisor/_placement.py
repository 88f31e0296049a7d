"""Where a model goes: a pure decision over (inventory, request, what is loaded, policy).

Nothing here touches a process, a file or a clock (except :func:`wait_for_release`, which is
given its reader and its sleep): the supervisor gathers the facts, calls :func:`place`, then
carries the decision out (unload ``evict``, wait for the memory, spawn with ``devices``,
``n_gpu_layers``, ``tensor_split``).

The ladder, as the issue orders it: one GPU with the whole model; else a tensor split over the
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

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from .._errors import PlacementError
from ..hardware._types import Device, Inventory
from ..models._estimate import MemoryEstimate, estimate_memory
from ..models._gguf import GGUFInfo

__all__ = [
    "GpuChoice",
    "LoadedModel",
    "PlacementDecision",
    "PlacementPolicy",
    "PlacementRequest",
    "ReleaseWait",
    "await_release",
    "format_bytes",
    "free_memory",
    "place",
    "wait_for_release",
]

GpuChoice = Literal["auto", "cpu"] | int | str | Sequence[int | str]
_GIB = 1024**3
_MIB = 1024**2


def format_bytes(n: int) -> str:
    if abs(n) >= _GIB:
        return f"{n / _GIB:.1f} GiB"
    return f"{n / _MIB:.0f} MiB"


@dataclass(frozen=True)
class PlacementRequest:
    """What is to be loaded, and the load settings that decide its size."""

    name: str
    info: GGUFInfo
    ctx_size: int | None = None
    """None or 0: the trained context (what llama-server allocates without ``-c``)."""
    parallel: int | None = None
    """Slots (``--parallel``); None: llama-server's auto (4 sharing one cache)."""
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    flash_attn: bool | None = None
    gpu: GpuChoice = "auto"
    """``"auto"``, ``"cpu"``, a GPU (ordinal ``1`` or key ``"amd:1"``) or a list of them."""
    n_gpu_layers: int | None = None
    """None: all layers (fewer only where the policy allows partial offload); explicit: exactly."""
    tensor_split: tuple[float, ...] | None = None
    """Explicit proportions for an explicit GPU list; otherwise by free memory."""
    n_ubatch: int = 512
    extra_args: tuple[str, ...] = ()
    """The child's extra llama-server arguments: the ones that change its size (``-c``, ``-np``,
    ``-ctk``, ``-ctv``, ``-fa``, ``-ub``, ``-ngl``, ``-ts``) are read by :meth:`effective`."""

    def effective(self) -> PlacementRequest:
        """This request with the size-changing flags of ``extra_args`` applied (they win, as
        they come last on the child's command line)."""
        return _apply_args(self)


@dataclass(frozen=True)
class LoadedModel:
    """A model we run (or are starting), as placement needs to know it."""

    name: str
    bytes_by_device: Mapping[str, int]
    """What it holds per device key: the child's logged actuals once ready, the estimate before."""
    devices: tuple[str, ...] = ()
    """The devices it was placed on (informational: the bytes above are what count)."""
    in_flight: int = 0
    last_used: float = 0.0
    """A monotonic timestamp of its last request's end (or of its load)."""
    counted: bool = True
    """Whether the inventory's used-memory counters already include everything it holds: true for
    a model that was ready before the inventory was read. Set False for one still loading (or an
    inventory read before it loaded): its bytes are then subtracted from the reported free memory.
    Either way free memory never exceeds the total minus everything our children hold."""
    visible_bytes: Mapping[str, int] = field(default_factory=dict)
    """When not ``counted``: per device, the part the counters already show."""

    def held(self, device: str) -> int:
        return self.bytes_by_device.get(device, 0)

    def in_counters(self, device: str) -> int:
        held = self.held(device)
        return held if self.counted else min(held, self.visible_bytes.get(device, 0))


@dataclass(frozen=True)
class PlacementPolicy:
    allow_evict: bool = True
    allow_partial_offload: bool = False
    allow_cpu_fallback: bool = False
    """Run on the CPU when GPUs exist but the model fits none (slow: off unless asked)."""
    estimate_margin: float = 0.05
    """Extra fraction of the estimate to require free (the estimate is within ~10 %)."""
    gpu_reserve_bytes: int = 256 * _MIB
    """Left free on every GPU (driver, other users, fragmentation)."""
    cpu_reserve_bytes: int = 1 * _GIB
    """Left free in system RAM."""
    max_loaded: int | None = None
    """At most this many models loaded at once (the LRU idle one makes room)."""


@dataclass(frozen=True)
class PlacementDecision:
    devices: tuple[str, ...]
    """GPU keys in the child's device order, or ``("cpu",)``."""
    n_gpu_layers: int
    tensor_split: list[float] | None
    evict: list[str]
    """Loaded models to unload, in this order, before spawning."""
    estimate: MemoryEstimate
    need_bytes: dict[str, int]
    """Per device: what must be free before the spawn (estimate plus margin plus reserve)."""
    reason: str

    @property
    def on_cpu(self) -> bool:
        return self.devices == ("cpu",)

    @property
    def estimated_bytes(self) -> dict[str, int]:
        """The estimate's total per device key (what the child is expected to hold)."""
        return {k: v for k, v in self.estimate.by_device.items() if v > 0}

    def to_json(self) -> dict[str, object]:
        return {
            "devices": list(self.devices),
            "n_gpu_layers": self.n_gpu_layers,
            "tensor_split": self.tensor_split,
            "evict": list(self.evict),
            "need_bytes": dict(self.need_bytes),
            "reason": self.reason,
            "estimate": self.estimate.to_json(),
        }


_FLAGS = {
    "-c": "ctx_size",
    "--ctx-size": "ctx_size",
    "-np": "parallel",
    "--parallel": "parallel",
    "-ctk": "cache_type_k",
    "--cache-type-k": "cache_type_k",
    "-ctv": "cache_type_v",
    "--cache-type-v": "cache_type_v",
    "-fa": "flash_attn",
    "--flash-attn": "flash_attn",
    "-ub": "n_ubatch",
    "--ubatch-size": "n_ubatch",
    "-ngl": "n_gpu_layers",
    "--gpu-layers": "n_gpu_layers",
    "--n-gpu-layers": "n_gpu_layers",
    "-ts": "tensor_split",
    "--tensor-split": "tensor_split",
}


def _apply_args(request: PlacementRequest) -> PlacementRequest:
    changes: dict[str, object] = {}
    args = list(request.extra_args)
    for i, arg in enumerate(args):
        flag, eq, inline = arg.partition("=")
        name = _FLAGS.get(flag)
        if name is None:
            continue
        value = inline if eq else (args[i + 1] if i + 1 < len(args) else "")
        try:
            if name in ("ctx_size", "parallel", "n_ubatch"):
                changes[name] = int(value)
            elif name == "n_gpu_layers":
                changes[name] = None if value in ("auto", "all") else int(value)
            elif name == "flash_attn":
                changes[name] = {"on": True, "off": False}.get(value.lower())
            elif name == "tensor_split":
                changes[name] = tuple(float(x) for x in value.replace("/", ",").split(",") if x)
            else:
                changes[name] = value.lower()
        except ValueError:
            continue  # llama-server will refuse it itself, with its own message
    return replace(request, **changes) if changes else request  # type: ignore[arg-type]


# -- free memory -----------------------------------------------------------------------------------


def free_memory(
    inventory: Inventory, loaded: Sequence[LoadedModel], evicted: Sequence[LoadedModel] = ()
) -> dict[str, int]:
    """Free bytes per device key (usable devices only), as if ``evicted`` were already gone."""
    out: dict[str, int] = {}
    for dev in inventory.devices:
        if not dev.usable:
            continue
        k = dev.key
        pending = sum(m.held(k) - m.in_counters(k) for m in loaded)
        released = sum(m.in_counters(k) for m in evicted)
        held = sum(m.held(k) for m in loaded)
        free = dev.vram_total_bytes - dev.vram_used_bytes - pending + released
        out[k] = max(0, min(free, dev.vram_total_bytes - held))
    return out


# -- layouts ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Layout:
    gpus: tuple[str, ...]
    n_gpu_layers: int
    split: tuple[float, ...] | None
    estimate: MemoryEstimate
    kind: str


class _Planner:
    """One request's layouts, estimated and checked against a free-memory map."""

    def __init__(self, inventory: Inventory, request: PlacementRequest, policy: PlacementPolicy) -> None:
        self.inv = inventory
        self.req = request
        self.policy = policy
        self.n_layer = request.info.block_count

    # estimates
    def layout(
        self,
        gpus: Sequence[str],
        ngl: int | None,
        split: Sequence[float] | None,
        kind: str,
        *,
        ctx_size: int | None = None,
        quantized_cache: bool = False,
    ) -> _Layout:
        r = self.req
        if quantized_cache:
            r = replace(r, cache_type_k="q8_0", cache_type_v="q8_0", flash_attn=True)
        est = estimate_memory(
            r.info,
            n_gpu_layers=ngl if gpus else 0,
            ctx_size=(r.ctx_size or 0) if ctx_size is None else ctx_size,
            parallel=r.parallel,
            cache_type_k=r.cache_type_k,
            cache_type_v=r.cache_type_v,
            flash_attn=r.flash_attn,
            devices=tuple(gpus) or ("cpu",),
            tensor_split=split,
            n_ubatch=r.n_ubatch,
        )
        return _Layout(tuple(gpus), est.n_gpu_layers, tuple(split) if split else None, est, kind)

    def need(self, layout: _Layout) -> dict[str, int]:
        out = {}
        for d in layout.estimate.devices:
            if d.total_bytes == 0 and d.device != "cpu":
                continue
            reserve = self.policy.cpu_reserve_bytes if d.device == "cpu" else self.policy.gpu_reserve_bytes
            out[d.device] = int(d.total_bytes * (1 + self.policy.estimate_margin)) + reserve
        return out

    def overflow(self, layout: _Layout, free: Mapping[str, int]) -> dict[str, int]:
        """Device → bytes missing (empty: it fits)."""
        return {k: v - free.get(k, 0) for k, v in self.need(layout).items() if v > free.get(k, 0)}

    def fits(self, layout: _Layout, free: Mapping[str, int]) -> bool:
        return not self.overflow(layout, free)

    # the ladder
    def cpu(self, free: Mapping[str, int]) -> _Layout | None:
        lay = self.layout((), 0, None, "cpu")
        return lay if self.fits(lay, free) else None

    def single(self, gpus: Sequence[Device], free: Mapping[str, int]) -> _Layout | None:
        for dev in sorted(gpus, key=lambda d: (-free.get(d.key, 0), d.vendor, d.index)):
            lay = self.layout((dev.key,), self.req.n_gpu_layers, None, "one GPU")
            if self.fits(lay, free):
                return lay
        return None

    def split(
        self,
        gpus: Sequence[Device],
        free: Mapping[str, int],
        explicit: Sequence[float] | None = None,
        *,
        exact: bool = False,
    ) -> _Layout | None:
        """Over the fewest GPUs of one vendor (most free first), split by free memory; ``exact``:
        over all of ``gpus`` (the user's list), by ``explicit`` proportions if given."""
        by_vendor: dict[str, list[Device]] = {}
        for d in gpus:
            by_vendor.setdefault(d.vendor, []).append(d)
        best: _Layout | None = None
        for group in by_vendor.values():
            ranked = sorted(group, key=lambda d: (-free.get(d.key, 0), d.index))
            sizes = [len(ranked)] if exact or explicit else range(2, len(ranked) + 1)
            for k in sizes:
                chosen = sorted(ranked[:k], key=lambda d: d.index)
                lay = self._balanced(chosen, free, explicit)
                if lay is not None:
                    if best is None or len(lay.gpus) < len(best.gpus):
                        best = lay
                    break
        return best

    def _balanced(
        self, chosen: Sequence[Device], free: Mapping[str, int], explicit: Sequence[float] | None
    ) -> _Layout | None:
        keys = [d.key for d in chosen]
        room = [max(1, free.get(k, 0) - self.policy.gpu_reserve_bytes) for k in keys]
        weights = list(explicit) if explicit else [float(r) for r in room]
        for _ in range(6):  # shift layers away from a device that overflows, a few times
            split = [round(w / sum(weights), 4) for w in weights]
            lay = self.layout(keys, self.req.n_gpu_layers, split, f"split over {len(keys)} GPUs")
            over = self.overflow(lay, free)
            if not over:
                return lay
            if explicit or "cpu" in over:
                return None
            for i, k in enumerate(keys):
                if k in over:
                    need = lay.estimate.bytes_on(k) or 1
                    weights[i] *= max(0.05, (need - over[k]) / need)
        return None

    def partial(self, gpus: Sequence[Device], free: Mapping[str, int]) -> _Layout | None:
        """As many layers as fit on the GPU(s), the rest on the CPU."""
        best: _Layout | None = None
        groups: list[list[Device]] = [[d] for d in gpus]
        vendors = {d.vendor for d in gpus}
        for v in vendors:
            same = [d for d in gpus if d.vendor == v]
            if len(same) > 1:
                groups.append(same)
        for group in groups:
            keys = [d.key for d in sorted(group, key=lambda d: d.index)]
            split = [float(max(1, free.get(k, 0))) for k in keys] if len(keys) > 1 else None
            lo, hi, found = 1, self.n_layer, None
            while lo <= hi:
                mid = (lo + hi) // 2
                lay = self.layout(keys, mid, split, "partial offload")
                if self.fits(lay, free):
                    found, lo = lay, mid + 1
                else:
                    hi = mid - 1
            if found is not None and (best is None or found.n_gpu_layers > best.n_gpu_layers):
                best = found
        return best

    def auto(self, free: Mapping[str, int]) -> _Layout | None:
        gpus = [d for d in self.inv.gpus if d.key in free]
        if not gpus:
            return self.cpu(free)
        if self.req.n_gpu_layers == 0:
            return self.cpu(free)
        lay = self.single(gpus, free) or self.split(gpus, free)
        if lay is None and self.policy.allow_partial_offload and self.req.n_gpu_layers is None:
            lay = self.partial(gpus, free)
        if lay is None and self.policy.allow_cpu_fallback:
            lay = self.cpu(free)
        return lay

    def explicit(self, chosen: Sequence[Device], free: Mapping[str, int]) -> _Layout | None:
        if self.req.n_gpu_layers == 0:
            return self.cpu(free)
        if len(chosen) == 1:
            lay = self.layout((chosen[0].key,), self.req.n_gpu_layers, None, "the chosen GPU")
            if self.fits(lay, free):
                return lay
        else:
            found = self.split(chosen, free, self.req.tensor_split, exact=True)
            if found is not None:
                return found
        if self.policy.allow_partial_offload and self.req.n_gpu_layers is None:
            return self.partial(chosen, free) if len(chosen) == 1 else self.partial_group(chosen, free)
        return None

    def partial_group(self, chosen: Sequence[Device], free: Mapping[str, int]) -> _Layout | None:
        lay = self.partial(chosen, free)
        return lay if lay is not None and len(lay.gpus) == len(chosen) else None


# -- choosing devices ------------------------------------------------------------------------------


def _describe(dev: Device) -> str:
    return f"{dev.key} ({dev.name})"


def _resolve_gpu(inventory: Inventory, spec: int | str) -> Device:
    gpus_all = [d for d in inventory.devices if d.vendor != "cpu"]
    if isinstance(spec, str) and not spec.strip().isdigit():
        try:
            dev = inventory.by_key(spec.strip())
        except KeyError:
            dev = None
        if dev is None or dev.vendor == "cpu":
            raise PlacementError(
                f"no GPU {spec!r} on this machine",
                hint=f"GPUs: {', '.join(_describe(d) for d in gpus_all) or 'none'}; or use gpu=auto / cpu",
            )
    else:
        index = int(spec)
        matches = [d for d in gpus_all if d.index == index]
        if not matches:
            raise PlacementError(
                f"no GPU {index} on this machine",
                hint=f"GPUs: {', '.join(_describe(d) for d in gpus_all) or 'none'}; or use gpu=auto / cpu",
            )
        if len(matches) > 1:
            raise PlacementError(
                f"GPU {index} is ambiguous here ({', '.join(_describe(d) for d in matches)})",
                hint="name it by key, e.g. gpu=" + matches[0].key,
            )
        dev = matches[0]
    if not dev.usable:
        raise PlacementError(
            f"GPU {_describe(dev)} is not usable: {dev.skip_reason or 'excluded by discovery'}",
            hint="choose another GPU, or gpu=auto",
        )
    return dev


def _chosen(inventory: Inventory, gpu: GpuChoice) -> list[Device] | Literal["auto", "cpu"]:
    if isinstance(gpu, str):
        text = gpu.strip().lower()
        if text in ("auto", ""):
            return "auto"
        if text == "cpu":
            return "cpu"
        if "," in text:
            return _chosen(inventory, [p for p in text.split(",") if p.strip()])
        return [_resolve_gpu(inventory, gpu)]
    if isinstance(gpu, int):
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
    planner = _Planner(inventory, request, policy)
    choice = _chosen(inventory, request.gpu)
    others = [m for m in loaded if m.name != request.name]

    def attempt(free: Mapping[str, int]) -> _Layout | None:
        if choice == "auto":
            return planner.auto(free)
        if choice == "cpu":
            return planner.cpu(free)
        return planner.explicit(choice, free)

    idle = sorted((m for m in others if m.in_flight == 0), key=lambda m: (m.last_used, m.name))
    forced: list[LoadedModel] = []
    if policy.max_loaded is not None and len(others) >= policy.max_loaded:
        excess = len(others) - policy.max_loaded + 1
        if not policy.allow_evict or len(idle) < excess:
            raise PlacementError(
                f"{request.name} cannot be loaded: {len(others)} models are loaded (at most "
                f"{policy.max_loaded}) and {'eviction is off' if not policy.allow_evict else 'too few are idle'}",
                hint="unload a model, or raise the limit of loaded models",
            )
        forced = idle[:excess]

    evicted = list(forced)
    remaining = [m for m in others if m not in evicted]
    layout = attempt(free_memory(inventory, remaining, evicted))
    if layout is None and policy.allow_evict:
        for m in idle:
            if m in evicted:
                continue
            evicted.append(m)
            remaining = [x for x in others if x not in evicted]
            layout = attempt(free_memory(inventory, remaining, evicted))
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
        raise _refusal(inventory, request, others, policy, planner, choice)

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


def _reason(inventory: Inventory, layout: _Layout) -> str:
    if not layout.gpus:
        return "on the CPU"
    names = ", ".join(_describe(inventory.by_key(k)) for k in layout.gpus)
    if layout.kind == "partial offload":
        total = sum(d.layers for d in layout.estimate.devices) + 1
        return f"partial offload: {layout.n_gpu_layers} of {total} layers on {names}"
    return f"{layout.kind}: {names}"


# -- refusal ---------------------------------------------------------------------------------------


def _refusal(
    inventory: Inventory,
    request: PlacementRequest,
    others: Sequence[LoadedModel],
    policy: PlacementPolicy,
    planner: _Planner,
    choice: list[Device] | Literal["auto", "cpu"],
) -> PlacementError:
    idle = [m for m in others if m.in_flight == 0]
    busy = [m for m in others if m.in_flight > 0]
    evictable = idle if policy.allow_evict else []
    kept = [*busy, *(idle if not policy.allow_evict else [])]
    free = free_memory(inventory, kept, evictable)
    if choice == "cpu" or (choice == "auto" and not inventory.gpus) or request.n_gpu_layers == 0:
        targets: list[Device] = []
    elif choice == "auto":
        targets = list(inventory.gpus)
    else:
        targets = list(choice)
    if targets:
        best = max(targets, key=lambda d: free.get(d.key, 0))
        lay = planner.layout((best.key,), request.n_gpu_layers, None, "one GPU")
        where = "one GPU" if len(targets) > 1 else best.key
    else:
        best = None
        lay = planner.layout((), 0, None, "cpu")
        where = "system RAM"
    est = lay.estimate
    target_key = best.key if best is not None else "cpu"
    need_dev = est.bytes_on(target_key)
    r = request
    slots = f" × {est.parallel} slots" if est.parallel > 1 else ""
    parts = (
        f"weights {format_bytes(est.device(target_key).weights_bytes)}, "
        f"KV cache {format_bytes(est.device(target_key).kv_bytes)}, "
        f"compute {format_bytes(est.device(target_key).compute_bytes + est.device(target_key).output_bytes)}"
    )
    frees = []
    for dev in inventory.devices:
        if not dev.usable:
            continue
        if targets and dev.vendor == "cpu" and "cpu" not in planner.need(lay):
            continue
        frees.append(
            f"{_describe(dev)} {format_bytes(free.get(dev.key, 0))} of {format_bytes(dev.vram_total_bytes)}"
        )
    message = (
        f"{r.name} ({r.info.file_type}, ctx {est.ctx_size}{slots}) does not fit: it needs "
        f"{format_bytes(need_dev)} on {where} ({parts}); free: {'; '.join(frees)}"
    )
    if busy:
        message += f"; busy, not evicted: {', '.join(m.name for m in busy)}"
    if idle and not policy.allow_evict:
        message += f"; eviction is off, idle: {', '.join(m.name for m in idle)}"
    hint = _advice(request, planner, free, best, lay)
    if idle and not policy.allow_evict:
        hint = f"unload an idle model, or {hint}"
    return PlacementError(message, hint=hint)


def _advice(
    request: PlacementRequest,
    planner: _Planner,
    free: Mapping[str, int],
    best: Device | None,
    lay: _Layout,
) -> str:
    tips: list[str] = []
    target = best.key if best is not None else "cpu"
    gpus = (best.key,) if best is not None else ()
    # A smaller context: the largest power-of-two-ish size that fits, if any.
    est = lay.estimate
    for ctx in (131072, 65536, 32768, 16384, 8192, 4096, 2048, 1024, 512):
        if ctx >= est.ctx_size:
            continue
        trial = planner.layout(gpus, request.n_gpu_layers, None, "ctx", ctx_size=ctx)
        if planner.fits(trial, free):
            tips.append(f"--ctx-size {ctx}")
            break
    if best is not None and request.n_gpu_layers != 0:
        fit_layers = 0
        for ngl in range(request.info.block_count, 0, -1):
            if planner.fits(planner.layout(gpus, ngl, None, "layers"), free):
                fit_layers = ngl
                break
        if fit_layers:
            tips.append(f"--n-gpu-layers {fit_layers} (partial offload, slower)")
    if request.cache_type_k == "f16" and request.cache_type_v == "f16":
        trial = planner.layout(gpus, request.n_gpu_layers, None, "q8 cache", quantized_cache=True)
        if planner.fits(trial, free):
            tips.append("--cache-type-k q8_0 --cache-type-v q8_0 (halves the KV cache)")
    weights = est.device(target).weights_bytes
    tips.append(
        f"a smaller quantization than {request.info.file_type}"
        + (f" (the weights alone need {format_bytes(weights)})" if weights > free.get(target, 0) else "")
    )
    return "try " + ", or ".join(tips)


# -- waiting for memory to come back ---------------------------------------------------------------


@dataclass(frozen=True)
class ReleaseWait:
    ok: bool
    free: dict[str, int]
    waited_s: float
    short: dict[str, int]
    """Per device: bytes still missing when the wait ended (empty when ``ok``)."""


def _short(free: Mapping[str, int], need: Mapping[str, int]) -> dict[str, int]:
    return {k: v - free.get(k, 0) for k, v in need.items() if free.get(k, 0) < v}


def wait_for_release(
    read_free: Callable[[], Mapping[str, int]],
    need: Mapping[str, int],
    *,
    timeout_s: float = 5.0,
    poll_s: float = 0.25,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> ReleaseWait:
    """After an unload, poll fresh free memory until every device has ``need`` free, or time out.

    Drivers give VRAM back some time after the process exits (Ollama waits up to 5 s).
    ``read_free`` returns free bytes per device key (e.g. from a fresh discovery).
    """
    start = clock()
    while True:
        free = dict(read_free())
        short = _short(free, need)
        waited = clock() - start
        if not short:
            return ReleaseWait(True, free, waited, {})
        if waited >= timeout_s:
            return ReleaseWait(False, free, waited, short)
        sleep(min(poll_s, max(0.0, timeout_s - waited)))


async def await_release(
    read_free: Callable[[], Mapping[str, int]],
    need: Mapping[str, int],
    *,
    timeout_s: float = 5.0,
    poll_s: float = 0.25,
) -> ReleaseWait:
    """:func:`wait_for_release` for the anyio service loop (``read_free`` must not block long)."""
    import anyio

    start = anyio.current_time()
    while True:
        free = dict(read_free())
        short = _short(free, need)
        waited = anyio.current_time() - start
        if not short:
            return ReleaseWait(True, free, waited, {})
        if waited >= timeout_s:
            return ReleaseWait(False, free, waited, short)
        await anyio.sleep(min(poll_s, max(0.0, timeout_s - waited)))
