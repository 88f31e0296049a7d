"""The placement planners: a request's candidate layouts, estimated and checked against free memory.

:class:`Planner` walks a GGUF model's ladder (one GPU, a split, a partial offload, the CPU) with
the memory estimate; :class:`SizedPlanner` places a model of a given size (whisper, a command)
on the devices its ``gpu`` names. Both answer the same two questions for :func:`~._placement.place`
(what fits in this free memory; what it needs free), which does the rest once for every backend.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from ...hardware import Device, Inventory
from ...models import DeviceEstimate, MemoryEstimate, estimate_memory
from ._placement_types import PlacementPolicy, PlacementRequest, SizedRequest

__all__ = ["Layout", "Planner", "SizedPlanner"]

_GIB = 1024**3

# -- layouts ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Layout:
    gpus: tuple[str, ...]
    n_gpu_layers: int
    split: tuple[float, ...] | None
    estimate: MemoryEstimate
    kind: str


class Planner:
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
    ) -> Layout:
        r = self.req
        if quantized_cache:
            r = replace(r, cache_type_k="q8_0", cache_type_v="q8_0", flash_attn=True)
        est = estimate_memory(
            r.info,
            n_gpu_layers=ngl if gpus else 0,
            ctx_size=(r.ctx_size or 0) if ctx_size is None else ctx_size,
            parallel=r.parallel,
            kv_unified=r.kv_unified is not False,  # forge's default: one shared cache
            cache_type_k=r.cache_type_k,
            cache_type_v=r.cache_type_v,
            flash_attn=r.flash_attn,
            devices=tuple(gpus) or ("cpu",),
            tensor_split=split,
            n_ubatch=r.n_ubatch,
            embeddings=r.embeddings,
            repack=r.repack,
            projector=r.projector,
            projector_offload=r.projector_offload,
            device_context=self.policy.device_context,
            draft=r.draft,
            draft_on_gpu=r.draft_on_gpu,
            adapter_bytes=r.adapter_bytes,
        )
        return Layout(tuple(gpus), est.n_gpu_layers, tuple(split) if split else None, est, kind)

    def need(self, layout: Layout) -> dict[str, int]:
        out = {}
        for d in layout.estimate.devices:
            if d.total_bytes == 0 and d.device != "cpu":
                continue
            reserve = self.policy.cpu_reserve_bytes if d.device == "cpu" else self.policy.gpu_reserve_bytes
            # The margin covers the estimate's error; the device context is a measured figure.
            margin = int(d.allocated_bytes * (1 + self.policy.estimate_margin))
            out[d.device] = margin + d.context_bytes + reserve
        return out

    def overflow(self, layout: Layout, free: Mapping[str, int]) -> dict[str, int]:
        """Device → bytes missing (empty: it fits)."""
        return {k: v - free.get(k, 0) for k, v in self.need(layout).items() if v > free.get(k, 0)}

    def fits(self, layout: Layout, free: Mapping[str, int]) -> bool:
        return not self.overflow(layout, free)

    # the ladder
    def cpu(self, free: Mapping[str, int]) -> Layout | None:
        lay = self.layout((), 0, None, "cpu")
        return lay if self.fits(lay, free) else None

    def single(self, gpus: Sequence[Device], free: Mapping[str, int]) -> Layout | None:
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
    ) -> Layout | None:
        """Over the fewest GPUs of one vendor (most free first), split by free memory; ``exact``:
        over all of ``gpus`` (the user's list), by ``explicit`` proportions if given."""
        by_vendor: dict[str, list[Device]] = {}
        for d in gpus:
            by_vendor.setdefault(d.vendor, []).append(d)
        best: Layout | None = None
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
    ) -> Layout | None:
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

    def partial(self, gpus: Sequence[Device], free: Mapping[str, int]) -> Layout | None:
        """As many layers as fit on the GPU(s), the rest on the CPU."""
        best: Layout | None = None
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

    def auto(self, free: Mapping[str, int]) -> Layout | None:
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

    def explicit(self, chosen: Sequence[Device], free: Mapping[str, int]) -> Layout | None:
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

    def same_shape(self, layout: Layout, free: Mapping[str, int]) -> Layout | None:
        """``layout``'s devices and kind again, for this planner's request (another context):
        the same GPU(s) (a split balanced again by ``free``), the same layers when it was a
        partial offload; None when a split no longer fits."""
        if not layout.gpus:
            return self.layout((), 0, None, layout.kind)
        partial = layout.kind == "partial offload"
        ngl = layout.n_gpu_layers if partial else self.req.n_gpu_layers
        if len(layout.gpus) == 1 or partial:
            return self.layout(layout.gpus, ngl, layout.split, layout.kind)
        chosen = [self.inv.by_key(k) for k in layout.gpus]
        return self._balanced(chosen, free, self.req.tensor_split)

    def partial_group(self, chosen: Sequence[Device], free: Mapping[str, int]) -> Layout | None:
        lay = self.partial(chosen, free)
        return lay if lay is not None and len(lay.gpus) == len(chosen) else None


class SizedPlanner:
    """A :class:`~._placement_types.SizedRequest`'s layouts: its bytes on each device of one
    option, the options in the order tried (``auto``: each usable GPU, the most free first, then
    the CPU; ``cpu``; the GPUs ``gpu`` names). No reserve or margin is added: the size is the
    user's figure (a command's ``memory``) or whisper.cpp's own accounting, not an estimate."""

    def __init__(
        self, inventory: Inventory, request: SizedRequest, choice: Sequence[Device] | Literal["auto", "cpu"]
    ) -> None:
        self.inv = inventory
        self.req = request
        self.choice = choice

    def options(self, free: Mapping[str, int]) -> list[tuple[Device, ...]]:
        if self.choice == "cpu":
            return [(self.inv.cpu,)]
        if self.choice == "auto":
            gpus = sorted(
                (d for d in self.inv.gpus if d.usable), key=lambda d: free.get(d.key, 0), reverse=True
            )
            return [*((d,) for d in gpus), (self.inv.cpu,)]
        chosen = tuple(self.choice)
        return [chosen[:1] if self.req.one_device else chosen]

    def layout(self, devices: Sequence[Device]) -> Layout:
        r = self.req
        gpus = tuple(d.key for d in devices if d.vendor != "cpu")
        estimate = MemoryEstimate(
            devices=tuple(
                DeviceEstimate(device=d.key, weights_bytes=r.weights_bytes, compute_bytes=r.compute_bytes)
                for d in devices
            ),
            n_gpu_layers=r.gpu_layers if gpus else 0,
            ctx_size=0,
            parallel=1,
            kv_unified=False,
            cache_type_k="f16",
            cache_type_v="f16",
            flash_attn=r.flash_attn,
        )
        return Layout(gpus, estimate.n_gpu_layers, None, estimate, r.what)

    def need(self, layout: Layout) -> dict[str, int]:
        return {k: self.req.need_bytes for k in layout.gpus or ("cpu",)}

    def attempt(self, free: Mapping[str, int]) -> Layout | None:
        """The first option with the request's bytes free on each of its devices."""
        for devices in self.options(free):
            if all(free.get(d.key, 0) >= self.req.need_bytes for d in devices):
                return self.layout(devices)
        return None
