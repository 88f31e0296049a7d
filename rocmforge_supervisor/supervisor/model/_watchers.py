"""A model's watchers, one task each while its child runs: health (a hung child is killed),
progress (a stalled decode is killed), sleep (``sleep_idle``: whether the child freed its model)
and TTL (an idle model is unloaded). Each reads the model it watches and acts through its child
(``ModelServer.kill``) or its public steps (``unload``); the lifecycle in :mod:`._managed` starts
and cancels them with the child.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import anyio

from .._events import EventKind
from ._watchdog import ProgressWatch, poll_interval, slots_signature

if TYPE_CHECKING:
    from ...process import ModelServer
    from ._status import SupervisedModel

__all__ = ["watch_health", "watch_progress", "watch_sleep", "watch_ttl"]

log = logging.getLogger("rocmforge.supervisor")


async def watch_health(m: SupervisedModel, server: ModelServer) -> None:
    """A child that has not answered ``/health`` for ``health_interval × health_failures``
    seconds (SIGSTOP, deadlock) is killed.

    The probes overlap the interval instead of adding to it: one goes out every
    ``health_interval``, whether the one before has answered or not, and each may wait for
    its answer until that deadline (the last answer + interval × failures). Any answer moves
    the deadline on, so a slow child is not a hung one. Before, each failed check cost the
    interval plus its own timeout: the bound was about twice what the two knobs say
    (measured: 6.2 s for 1 s × 3).
    """
    interval = m.policy.health_interval
    window = interval * m.policy.health_failures
    answered = anyio.current_time()
    unanswered = 0  # probes sent since the last answer

    async def probe() -> None:
        nonlocal answered, unanswered
        sent = anyio.current_time()
        status = await server.health(timeout=max(0.01, answered + window - sent))
        if status == 200:
            if sent >= answered:  # the newest news: the probes sent before it are answered too
                answered, unanswered = anyio.current_time(), 0
            return
        now = anyio.current_time()
        msg = "model %s: /health check failed (no answer for %.1f s of %g s)"
        log.warning(msg, m.name, now - answered, window, extra={"model": m.name})

    async with anyio.create_task_group() as tg:
        due = answered + interval
        while True:
            await anyio.sleep_until(min(due, answered + window))
            now = anyio.current_time()
            if now >= answered + window:
                break
            if now >= due:
                unanswered += 1
                tg.start_soon(probe)
                due += interval
        tg.cancel_scope.cancel()
    m.events.publish(m.name, EventKind.HANG, failures=unanswered, seconds=window)
    m.last_error = f"no answer to /health for {window:g} s ({unanswered} checks): killed"
    server.kill(m.last_error)


async def watch_progress(m: SupervisedModel, server: ModelServer) -> None:
    """A child busy with our requests whose slots make no progress for ``stall_timeout`` is
    stalled (a wedged decode answers /health all the same: see ``_watchdog``): killed, and
    restarted through the crash path, which counts it in the breaker. The timeout is read at
    every poll: a reload that changes only ``stall_timeout`` keeps the child (0: off)."""
    watch = ProgressWatch(m.stall_timeout)
    while True:
        timeout = m.stall_timeout
        await anyio.sleep(poll_interval(timeout) if timeout > 0 else 1.0)
        if timeout <= 0:
            watch.observe(False, None)  # off: nothing counts, and a later timeout starts afresh
            continue
        watch.timeout = timeout
        interval = poll_interval(timeout)
        # A sleeping child reloading its model for a request answers /slots only once loaded:
        # a wake is not a stall.
        busy = m.in_flight > 0 and not m.sleeping
        signature = slots_signature(await server.slots(timeout=min(2.0, interval))) if busy else None
        if watch.observe(busy, signature):
            m.stalls += 1
            seconds = round(watch.stalled_for, 1)
            m.kill_reason = f"stalled: no progress for {seconds:g} s with {m.in_flight} request(s) in flight"
            m.events.publish(m.name, EventKind.STALL, seconds=seconds, in_flight=m.in_flight)
            log.warning("model %s: %s", m.name, m.kill_reason, extra={"model": m.name})
            server.kill(m.kill_reason)
            return


async def watch_sleep(m: SupervisedModel, server: ModelServer) -> None:
    """Whether the child sleeps (``sleep_idle``): ``/props``' ``is_sleeping``, which does not
    wake it, read every second; a change is an event, and the status says it."""
    try:
        while True:
            props = await server.props(timeout=2.0)
            sleeping = bool(props.get("is_sleeping")) if props is not None else m.sleeping
            if sleeping != m.sleeping:
                m.sleeping = sleeping
                m.events.publish(m.name, EventKind.SLEEP, sleeping=sleeping)
            await anyio.sleep(1.0)
    finally:
        m.sleeping = False  # a new child starts awake


async def watch_ttl(m: SupervisedModel) -> None:
    while True:
        if m.ttl <= 0:  # no ttl (yet): a client's keep_alive hint may set one later
            await anyio.sleep(1.0)
            continue
        idle_for = time.monotonic() - m.last_used
        if m.in_flight == 0 and m.waiting == 0 and idle_for >= m.ttl:
            m.events.publish(m.name, EventKind.TTL, idle_seconds=idle_for)
            await m.unload(reason="ttl")
            return
        await anyio.sleep(max(0.05, m.ttl - idle_for if m.in_flight == 0 else m.ttl))
