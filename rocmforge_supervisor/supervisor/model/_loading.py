"""Waiting for a model's load on behalf of a request, at most ``load_wait`` seconds.

A client must not hang on a cold load, nor get a bare 503: after ``load_wait`` it gets
:class:`ModelLoading` (503 + ``Retry-After`` at the edge) with what is known of the load —
LocalAI's protocol, ``{state, progress, eta_seconds}``. The load itself runs in the supervisor's
task group, so it goes on when a waiter gives up or its client disconnects; the next request joins
it. Progress and ETA come from the previous load of the same model (its measured duration); with
none yet they are None rather than a guess.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

import anyio

from ..._errors import ModelLoading
from ._status import SupervisedModel

if TYPE_CHECKING:
    from ...process import ModelServer

__all__ = ["loading_info", "wait_ready_within"]

#: The model itself: the ``start`` it is handed calls back with the same model.
M = TypeVar("M", bound=SupervisedModel)


def loading_info(m: M) -> dict[str, object]:
    elapsed = time.monotonic() - m.loading_since if m.loading_since else 0.0
    progress: float | None = None
    eta: float | None = None
    if m.load_seconds:
        progress = round(min(0.99, elapsed / m.load_seconds), 3)
        eta = round(max(1.0, m.load_seconds - elapsed), 1)
    return {"state": m.state.value, "progress": progress, "eta_seconds": eta}


async def wait_ready_within(m: M, start: Callable[[M], None], load_wait: float | None) -> ModelServer:
    """``m.wait_ready(start)``, but at most ``load_wait`` s (None: as long as it takes). Called
    only while the model is not ready (:meth:`ManagedModel.acquire` serves a loaded one itself)."""
    if load_wait is None:
        return await m.wait_ready(start)
    with anyio.move_on_after(load_wait):
        return await m.wait_ready(start)
    info = loading_info(m)
    eta = info["eta_seconds"]
    retry = min(30.0, eta) if isinstance(eta, float) else 5.0
    raise ModelLoading(
        f"model {m.name!r} is still loading after {load_wait:g} s",
        retry_after=retry,
        loading=info,
        hint="retry after the Retry-After seconds; the load goes on",
    )
