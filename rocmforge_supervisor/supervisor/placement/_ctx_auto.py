"""``ctx_size = "auto"``: the largest context that fits, chosen at each load (pure).

Placement calls :func:`choose_context` with what a layout of the model needs per device at a
given context (the memory estimate, plus the placer's margin and reserve) and the free memory
left beside the models that stay loaded (pinned, ``swap = "never"``, busy). The search is over
the tokens one request can use, in steps of 256 (llama.cpp pads every context, and with
``kv_unified = false`` every slot's share, to 256 cells): with one KV cache shared by the slots
``ctx_size`` is that many tokens, with a cache per slot it is that many times ``parallel``. The
trained context caps it the same way (per request), and ``ctx_min`` is the floor below which the
load is refused, with the numbers. A binary search over the estimate: about ten estimates.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from ..._errors import PlacementError
from ..._units import format_bytes

__all__ = [
    "CTX_STEP",
    "DEFAULT_CTX_MIN",
    "ContextChoice",
    "NeedAt",
    "choose_context",
    "context_floor",
    "largest_fitting",
    "slots_of",
]

#: The granularity of a chosen context, per request: llama.cpp pads to 256 cells.
CTX_STEP = 256
#: ``ctx_min`` when neither the model nor ``[supervisor]`` sets one.
DEFAULT_CTX_MIN = 2048
#: The cap when the GGUF names no trained context (llama.cpp's own fallback is the same order).
_UNKNOWN_TRAINED = 4096

#: ``ctx_size`` (all slots) → what the layout needs per device; None: no layout at that context.
NeedAt = Callable[[int], Mapping[str, int] | None]


@dataclass(frozen=True)
class ContextChoice:
    """What ``ctx_size = "auto"`` chose, and why (``forge plan``, ``/api/models``, the log)."""

    ctx_size: int
    """``--ctx-size``: every slot's tokens together."""
    per_request: int
    """Tokens one request can use (``/v1/models``' ``context_length``)."""
    ctx_min: int
    """The floor as applied: ``ctx_min``, or the trained context when that is smaller."""
    trained: int | None
    """The model's trained context (per request, the cap); None when the GGUF names none."""
    limit: Literal["trained", "memory"]
    """What stopped it: the trained context, or the memory (the next step does not fit)."""
    parallel: int
    unified: bool
    budget_bytes: Mapping[str, int] = field(default_factory=dict)
    """Per device: the free memory it was sized against (after what stays loaded)."""

    def describe(self) -> str:
        """``5376 tokens per request, the most that fits beside what stays loaded``."""
        slots = (
            ""
            if self.unified or self.parallel == 1
            else f" (ctx_size {self.ctx_size} for {self.parallel} slots)"
        )
        why = (
            "the model's trained context"
            if self.limit == "trained"
            else "the most that fits beside what stays loaded"
        )
        return f"{self.per_request} tokens per request{slots}, {why}"

    def to_json(self) -> dict[str, object]:
        return {
            "ctx_size": self.ctx_size,
            "per_request": self.per_request,
            "ctx_min": self.ctx_min,
            "trained": self.trained,
            "limit": self.limit,
            "parallel": self.parallel,
            "kv_unified": self.unified,
            "budget_bytes": dict(self.budget_bytes),
        }


def largest_fitting(fits: Callable[[int], bool], lo: int, hi: int, step: int = CTX_STEP) -> int | None:
    """The largest multiple of ``step`` in ``[lo, hi]`` (``lo`` and ``hi`` multiples of it) for
    which ``fits`` holds, assuming it holds for every value below one that does; None when it
    does not hold at ``lo``."""
    if hi < lo or not fits(lo):
        return None
    a, b = lo // step, hi // step  # fits(a * step) holds; find the last k in [a, b] that does
    while a < b:
        mid = (a + b + 1) // 2
        if fits(mid * step):
            a = mid
        else:
            b = mid - 1
    return a * step


def _overflow(need: Mapping[str, int] | None, free: Mapping[str, int]) -> dict[str, int]:
    if need is None:
        return {"": 1}
    return {k: v - free.get(k, 0) for k, v in need.items() if v > free.get(k, 0)}


def choose_context(
    need_at: NeedAt,
    free: Mapping[str, int],
    *,
    trained: int | None,
    ctx_min: int = DEFAULT_CTX_MIN,
    parallel: int = 4,
    unified: bool = True,
    name: str = "model",
    beside: str = "",
) -> ContextChoice:
    """The largest context whose need fits ``free`` on every device, per request a multiple of
    :data:`CTX_STEP` (or the trained context itself), at least ``ctx_min`` and at most the
    trained context. Raises :class:`PlacementError` with the numbers when even ``ctx_min`` does
    not fit. ``beside``: what stays loaded, for that message."""
    slots = slots_of(parallel, unified)

    def total(per_request: int) -> int:
        return per_request * slots

    def fits(per_request: int) -> bool:
        return not _overflow(need_at(total(per_request)), free)

    cap = trained or _UNKNOWN_TRAINED
    floor = context_floor(ctx_min, trained)

    def chosen(per_request: int, limit: Literal["trained", "memory"]) -> ContextChoice:
        return ContextChoice(
            ctx_size=total(per_request),
            per_request=per_request,
            ctx_min=floor,
            trained=trained,
            limit=limit,
            parallel=parallel,
            unified=unified,
            budget_bytes=dict(free),
        )

    if fits(cap):
        return chosen(cap, "trained")
    # Below the cap: a multiple of the step (a floor that is the cap itself did not fit).
    best = largest_fitting(fits, floor, cap // CTX_STEP * CTX_STEP) if floor < cap else None
    if best is None:
        raise _too_small(name, need_at(total(floor)), free, floor, slots, beside)
    return chosen(best, "memory")


def slots_of(parallel: int, unified: bool) -> int:
    """How many times one request's tokens ``ctx_size`` holds: 1 with one shared KV cache, else
    one share per slot."""
    return 1 if unified else max(1, parallel)


def context_floor(ctx_min: int, trained: int | None) -> int:
    """The fewest tokens per request a chosen context may have: ``ctx_min`` rounded up to a step,
    or the trained context when that is smaller."""
    return min(_round_up(ctx_min), trained or _UNKNOWN_TRAINED)


def _round_up(n: int) -> int:
    return max(CTX_STEP, (n + CTX_STEP - 1) // CTX_STEP * CTX_STEP)


def _too_small(
    name: str, need: Mapping[str, int] | None, free: Mapping[str, int], floor: int, slots: int, beside: str
) -> PlacementError:
    """``m: ctx_size = "auto" needs 3.1 GiB on cpu for ctx_min = 2048, and cpu has 1.2 GiB free``."""
    share = f" per slot × {slots}" if slots > 1 else ""
    stays = f" beside {beside}" if beside else ""
    if need is None:
        message = (
            f'{name}: ctx_size = "auto" finds no device that holds it at ctx_min = {floor}{share}{stays}'
        )
    else:
        over = _overflow(need, free)
        dev = max(over, key=lambda k: over[k])
        message = (
            f'{name}: ctx_size = "auto" needs {format_bytes(need[dev])} on {dev} for ctx_min = {floor}'
            f"{share}, and {dev} has {format_bytes(max(0, free.get(dev, 0)))} free{stays}"
        )
    return PlacementError(
        message,
        hint="lower ctx_min, unload a model, or use a smaller quantization (forge plan shows what fits)",
    )
