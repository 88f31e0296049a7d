"""Why a model does not fit, and what to change: the text of a placement refusal."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

from .._errors import PlacementError
from .._units import format_bytes
from ..hardware import Device, Inventory
from ._placement_types import LoadedModel, PlacementPolicy, PlacementRequest, describe_device, free_memory
from ._planner import Layout, Planner

__all__ = ["refusal"]

# -- refusal ---------------------------------------------------------------------------------------


def refusal(
    inventory: Inventory,
    request: PlacementRequest,
    others: Sequence[LoadedModel],
    policy: PlacementPolicy,
    planner: Planner,
    choice: list[Device] | Literal["auto", "cpu"],
) -> PlacementError:
    kept_by_rule = [m for m in others if m.residency.protected]
    idle = [m for m in others if m.in_flight == 0 and not m.residency.protected]
    busy = [m for m in others if m.in_flight > 0 and not m.residency.protected]
    evictable = idle if policy.allow_evict else []
    kept = [*busy, *kept_by_rule, *(idle if not policy.allow_evict else [])]
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
    if busy:
        message += f"; busy, not evicted: {', '.join(m.name for m in busy)}"
    if kept_by_rule:
        message += "; kept by their rules: " + ", ".join(
            f"{m.name} ({m.residency.rule})" for m in kept_by_rule
        )
    if idle and not policy.allow_evict:
        message += f"; eviction is off, idle: {', '.join(m.name for m in idle)}"
    hint = _advice(request, planner, free, best, lay)
    if idle and not policy.allow_evict:
        hint = f"unload an idle model, or {hint}"
    return PlacementError(message, hint=hint)


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
