"""What would make a model that fits nowhere fit: the smallest changes, computed with the estimate.

Pure, like placement: given the free memory (with none of forge's models loaded) and the model's
placement request, each change is tried alone through the same ladder placement climbs — a
smaller context (``ctx_size``, or ``ctx_min`` for ``ctx_size = "auto"``), an 8-bit KV cache,
fewer layers on the GPU (the rest in system RAM), a smaller quantization (its weights scaled down
until they fit) — and the ones that fit are returned, the least disruptive first.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from ..._units import format_bytes
from ...hardware import Inventory
from ...models import GGUFInfo
from ._ctx_auto import CTX_STEP, context_floor, largest_fitting, slots_of
from ._placement import _Ladder
from ._placement_types import PlacementPolicy, PlacementRequest
from ._planner import Planner

__all__ = ["Advice", "fit_advice", "fits_alone", "weights_bytes"]

#: Common llama.cpp quantizations, most bits per weight first (their typical bits per weight).
_QUANTS = (
    ("Q8_0", 8.5),
    ("Q6_K", 6.56),
    ("Q5_K_M", 5.69),
    ("Q4_K_M", 4.85),
    ("IQ4_XS", 4.25),
    ("Q3_K_M", 3.91),
    ("IQ3_XXS", 3.06),
    ("Q2_K", 2.63),
    ("IQ2_XXS", 2.06),
)


@dataclass(frozen=True)
class Advice:
    """One change that makes the model fit: the config key and value, and a line saying so."""

    key: str
    value: object
    text: str

    def to_json(self) -> dict[str, object]:
        return {"key": self.key, "value": self.value, "text": self.text}


def _sized(request: PlacementRequest) -> PlacementRequest:
    """``ctx_size = "auto"`` at its floor (the least it may load with); any other request as is."""
    if request.ctx_min is None:
        return request
    unified = request.kv_unified is not False
    parallel = request.parallel if request.parallel and request.parallel > 0 else 4
    floor = context_floor(request.ctx_min, request.info.context_length) * slots_of(parallel, unified)
    return replace(request, ctx_size=floor, ctx_min=None)


def _fits(
    inventory: Inventory, request: PlacementRequest, policy: PlacementPolicy, free: Mapping[str, int]
) -> bool:
    return _Ladder(inventory, _sized(request.effective()), policy).attempt(free) is not None


def fits_alone(
    inventory: Inventory, request: PlacementRequest, policy: PlacementPolicy, free: Mapping[str, int]
) -> bool:
    """Whether the request fits ``free`` at all (``auto``: at its floor)."""
    return _fits(inventory, request, policy, free)


def weights_bytes(info: GGUFInfo) -> int:
    """The model's weights as the estimate counts them (blocks, input and output layers)."""
    return sum(info.layer_bytes) + info.input_bytes + info.output_bytes


def _scaled(info: GGUFInfo, ratio: float) -> GGUFInfo:
    """The model with every weight ``ratio`` times as big (another quantization of it)."""

    def s(n: int) -> int:
        return int(n * ratio)

    return replace(
        info,
        layer_bytes=tuple(s(n) for n in info.layer_bytes),
        layer_repack_bytes=tuple(s(n) for n in info.layer_repack_bytes),
        input_bytes=s(info.input_bytes),
        output_bytes=s(info.output_bytes),
        embedding_bytes=s(info.embedding_bytes),
        output_repack_bytes=s(info.output_repack_bytes),
    )


def fit_advice(
    inventory: Inventory, request: PlacementRequest, policy: PlacementPolicy, free: Mapping[str, int]
) -> list[Advice]:
    """The changes, each alone, with which ``request`` would fit ``free``; the least disruptive
    first (a smaller context, an 8-bit KV cache, fewer GPU layers, a smaller quantization)."""
    request = request.effective()
    out: list[Advice] = []
    ctx = _smaller_context(inventory, request, policy, free)
    if ctx is not None:
        out.append(ctx)
    if request.cache_type_k == "f16" and request.cache_type_v == "f16":
        q8 = replace(request, cache_type_k="q8_0", cache_type_v="q8_0", flash_attn=True)
        if _fits(inventory, q8, policy, free):
            out.append(
                Advice(
                    "args",
                    ["-ctk", "q8_0", "-ctv", "q8_0"],
                    'args = ["-ctk", "q8_0", "-ctv", "q8_0"] (an 8-bit KV cache: half its size)',
                )
            )
    layers = _fewer_layers(inventory, request, policy, free)
    if layers is not None:
        out.append(layers)
    quant = _smaller_quant(inventory, request, policy, free)
    if quant is not None:
        out.append(quant)
    return out


def _smaller_context(
    inventory: Inventory, request: PlacementRequest, policy: PlacementPolicy, free: Mapping[str, int]
) -> Advice | None:
    """The largest context (per request, a multiple of 256) that fits, below the one asked."""
    unified = request.kv_unified is not False
    parallel = request.parallel if request.parallel and request.parallel > 0 else 4
    slots = slots_of(parallel, unified)
    sized = _sized(request)
    asked = (sized.ctx_size or request.info.context_length or 4096) // slots
    top = (asked - 1) // CTX_STEP * CTX_STEP
    if top < CTX_STEP:
        return None

    def fits(per_request: int) -> bool:
        trial = replace(request, ctx_size=per_request * slots, ctx_min=None)
        return _Ladder(inventory, trial, policy).attempt(free) is not None

    best = largest_fitting(fits, CTX_STEP, top)
    if best is None:
        return None
    if request.ctx_min is not None:
        return Advice(
            "ctx_min", best, f"ctx_min = {best} (auto then chooses at least {best} tokens per request)"
        )
    share = "" if slots == 1 else f" ({best} per slot × {slots})"
    return Advice("ctx_size", best * slots, f"ctx_size = {best * slots}{share}")


def _fewer_layers(
    inventory: Inventory, request: PlacementRequest, policy: PlacementPolicy, free: Mapping[str, int]
) -> Advice | None:
    """The most layers the GPUs it may use hold, the rest in system RAM (a partial offload)."""
    ladder = _Ladder(inventory, _sized(request), policy)
    choice = ladder.choice
    gpus = list(inventory.gpus) if choice == "auto" else [] if choice == "cpu" else choice
    if not gpus or request.n_gpu_layers == 0:
        return None
    planner = Planner(inventory, replace(_sized(request), n_gpu_layers=None), policy)
    layout = planner.partial(gpus, free)
    if layout is None or layout.n_gpu_layers <= 0:
        return None
    n = layout.n_gpu_layers
    total = request.info.block_count + 1
    return Advice(
        "gpu_layers",
        n,
        f"gpu_layers = {n} ({n} of {total} layers on {', '.join(layout.gpus)}, the rest in RAM: slower)",
    )


def _smaller_quant(
    inventory: Inventory, request: PlacementRequest, policy: PlacementPolicy, free: Mapping[str, int]
) -> Advice | None:
    """The largest weights that fit (the model's scaled down), and a quantization that size."""
    info = request.info
    weights = weights_bytes(info)
    if weights <= 0:
        return None

    def fits(percent: int) -> bool:
        return _fits(inventory, replace(request, info=_scaled(info, percent / 100)), policy, free)

    best = largest_fitting(fits, 1, 99, step=1)
    if best is None:
        return None  # not even its weights at 1 %: the rest (KV cache, buffers) does not fit
    budget = weights * best // 100
    name = ""
    if info.parameter_count > 0:
        bpw_now = weights * 8 / info.parameter_count
        bpw = bpw_now * best / 100
        name = next((q for q, bits in _QUANTS if bits <= bpw and bits < bpw_now), "")
    example = f": {name} or smaller" if name else ""
    return Advice(
        "path",
        budget,
        f"a quantization with at most {format_bytes(budget)} of weights "
        f"(now {format_bytes(weights)} as {info.file_type}){example}",
    )
