"""A request's way to a model's child: until the model is ready (starting it when nothing runs),
then one of its admission slots (:mod:`._admission`: priority classes, fair between keys).

Only what is beyond the in-flight limit waits in the queue; the surplus is refused at once
(:class:`~.._errors.QueueFull`). Each slot taken and given back counts the model's requests in
flight and sets its idle event (what a drain waits for). Kept apart from :mod:`._managed` for
size: ``ManagedModel.wait_ready`` and ``ManagedModel.acquire`` are these.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, TypeVar

import anyio

from ..._errors import ModelFailed, ModelRetired, QueueFull
from ._loading import wait_ready_within
from ._status import ModelState, SupervisedModel

if TYPE_CHECKING:
    from ...process import ModelServer
    from ..admission._admission import PriorityClass

__all__ = ["acquire_slot", "wait_until_ready"]

#: The model itself: the ``start`` it is handed calls back with the same model.
M = TypeVar("M", bound=SupervisedModel)


async def wait_until_ready(m: M, start: Callable[[M], None]) -> ModelServer:
    """Until ready; starts the child (via ``start``) when nothing runs. Raises when it failed."""
    joined = False  # a start this waiter caused or waited on: its refusal is this one's
    while True:
        if m.retired:
            raise ModelRetired(f"model {m.name!r} was replaced or removed", hint="retry")
        server = m.server
        if m.state == ModelState.READY and server is not None and server.serving:
            return server
        if m.state == ModelState.FAILED:
            raise ModelFailed(
                f"model {m.name!r} failed: {m.last_error}",
                kind=m.failure_kind,
                hint=f"fix the cause, then `forge load {m.name}` or reload the config",
            )
        if joined and not m.running and m.refused is not None:
            raise m.refused.again()
        changed = m._changed
        joined = joined or m.running
        if not m.running:
            m.refused = None  # a new start: the rules are asked again
            m.warming = False
            start(m)
            joined = True
        elif m.state == ModelState.DRAINING:
            await m._done.wait()
            continue
        await changed.wait()


@asynccontextmanager
async def acquire_slot(
    m: M,
    start: Callable[[M], None],
    load_wait: float | None = None,
    loaded: Callable[[], None] | None = None,
    priority: PriorityClass = "interactive",
    key: str | None = None,
) -> AsyncIterator[ModelServer]:
    """A slot at the child for one request: waits for load (``loaded`` is called once it is
    ready) and for the concurrency limit, in its ``priority`` class, fair between ``key``s
    (the API key's name; see :mod:`._admission`)."""
    # Only what is beyond the in-flight limit waits in the queue: `queue = 0` admits a request
    # while a slot is free (or will be, once the model loads) and refuses only the surplus.
    # The admission holds the in-flight limit resolved from the config (at start and at each
    # ``update_limits``): read there, not worked out again per request.
    if m.in_flight + m.waiting >= m.admission.slots + m.queue_limit:
        raise QueueFull(
            f"model {m.name!r} has {m.in_flight} requests in flight and {m.waiting} "
            f"waiting (max_concurrency = {m.max_concurrency}, queue = {m.queue_limit})",
            retry_after=1.0,
            hint="retry later, or raise the model's queue / max_concurrency",
        )
    m.waiting += 1
    try:
        while True:
            server = m.server
            # Every request to a loaded model: no load to wait for, no timeout scope to build.
            if m.state != ModelState.READY or m.retired or server is None or not server.serving:
                server = await wait_ready_within(m, start, load_wait)
            if loaded is not None:
                loaded()
            admission = m.admission
            await admission.take(priority, key)
            # The wait for a slot can be long: the child may have died, or the model may be
            # draining by now. Then give the slot back and wait for the next ready child.
            # (A child the watchdog just killed is alive until its exit is noticed: not serving.)
            if m.state == ModelState.READY and server is m.server and server.serving:
                break
            admission.give(priority, key)
    finally:
        m.waiting -= 1
    m.in_flight += 1
    m.requests_total += 1
    if m._idle.is_set():
        m._idle = anyio.Event()
    try:
        yield server
    finally:
        m.in_flight -= 1
        admission.give(priority, key)
        m.last_used = time.monotonic()
        if m.in_flight == 0:
            m._idle.set()
