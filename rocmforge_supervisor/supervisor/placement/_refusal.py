"""Why a model does not fit, and what to change: the text of a placement refusal.

One refusal per kind of planner (a GGUF's ladder, a model of a given size), with the same account
of the other models: which are busy, which are kept by their rules, which eviction would not touch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

from ..._errors import PlacementError
from ..._units import format_bytes
from ...hardware import Device, Inventory
from ._placement_types import (
    LoadedModel,
    PlacementPolicy,
    PlacementRequest,
    SizedRequest,
    describe_device,
    free_memory,
)
from ._planner import Layout, Planner, SizedPlanner

__all__ = ["refusal", "sized_refusal"]

# -- refusal ---------------------------------------------------------------------------------------


def refusal(
    inventory: Inventory,
    request: PlacementRequest,
    others: Sequence[LoadedModel],
    policy: PlacementPolicy,
    planner: Planner,
    choice: list[Device] | Literal["auto", "cpu"],
) -> PlacementError:
    """A GGUF model that fits no layout even with every evictable model gone: its size on the best
    target, split into its parts, what each device has free, and the settings that would fit."""
    others_now = _Others(others, policy)
    free = others_now.free(inventory)
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
    if est.device(target_key).context_bytes:
        parts += f", device context {format_bytes(est.device(target_key).context_bytes)}"
    frees = []
    for dev in inventory.devices:
        if not dev.usable:
            continue
        if targets and dev.vendor == "cpu" and "cpu" not in planner.need(lay):
            continue
        frees.append(
            f"{describe_device(dev)} {format_bytes(free.get(dev.key, 0))} of {format_bytes(dev.vram_total_bytes)}"
        )
    message = (
        f"{r.name} ({r.info.file_type}, ctx {est.ctx_size}{slots}) does not fit: it needs "
        f"{format_bytes(need_dev)} on {where} ({parts}); free: {'; '.join(frees)}"
    )
    message += others_now.notes()
    hint = _advice(request, planner, free, best, lay)
    if others_now.unevicted_idle:
        hint = f"unload an idle model, or {hint}"
    return PlacementError(message, hint=hint)


def sized_refusal(
    inventory: Inventory,
    request: SizedRequest,
    others: Sequence[LoadedModel],
    policy: PlacementPolicy,
    planner: SizedPlanner,
) -> PlacementError:
    """A model of a given size that fits no option even with every evictable model gone: what it
    needs per device, what each device it may use has free of its total, and who holds the rest."""
    others_now = _Others(others, policy)
    free = others_now.free(inventory)
    devices = dict.fromkeys(d for option in planner.options(free) for d in option)
    frees = "; ".join(
        f"{describe_device(d)} {format_bytes(free.get(d.key, 0))} of {format_bytes(d.vram_total_bytes)}"
        for d in devices
    )
    note = f" ({request.size_note})" if request.size_note else ""
    each = "" if request.one_device else " per device"
    message = (
        f"{request.name} ({request.what}) does not fit: it needs {format_bytes(request.need_bytes)}"
        f"{each}{note}; free: {frees}{others_now.notes()}"
    )
    hint = request.advice or "choose a smaller model"
    if others_now.busy or others_now.kept_by_rule or others_now.unevicted_idle:
        hint = f"unload another model (`forge unload NAME`), or {hint}"
    return PlacementError(message, hint=hint)


class _Others:
    """The other loaded models as a refusal tells them: busy, kept by their rules, idle."""

    def __init__(self, others: Sequence[LoadedModel], policy: PlacementPolicy) -> None:
        self.kept_by_rule = [m for m in others if m.residency.protected]
        self.idle = [m for m in others if m.in_flight == 0 and not m.residency.protected]
        self.busy = [m for m in others if m.in_flight > 0 and not m.residency.protected]
        self.allow_evict = policy.allow_evict

    @property
    def unevicted_idle(self) -> list[LoadedModel]:
        """Idle models that stay only because this placement may not evict (the warm default)."""
        return [] if self.allow_evict else self.idle

    def free(self, inventory: Inventory) -> dict[str, int]:
        """Free memory per device as if every model eviction may unload were gone."""
        evictable = self.idle if self.allow_evict else []
        kept = [*self.busy, *self.kept_by_rule, *self.unevicted_idle]
        return free_memory(inventory, kept, evictable)

    def notes(self) -> str:
        """``; busy, not evicted: …; kept by their rules: …; eviction is off, idle: …``."""
        out = ""
        if self.busy:
            out += f"; busy, not evicted: {', '.join(m.name for m in self.busy)}"
        if self.kept_by_rule:
            out += "; kept by their rules: " + ", ".join(
                f"{m.name} ({m.residency.rule})" for m in self.kept_by_rule
            )
        if self.unevicted_idle:
            out += f"; eviction is off, idle: {', '.join(m.name for m in self.unevicted_idle)}"
        return out


def _advice(
    request: PlacementRequest,
    planner: Planner,
    free: Mapping[str, int],
    best: Device | None,
    lay: Layout,
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
