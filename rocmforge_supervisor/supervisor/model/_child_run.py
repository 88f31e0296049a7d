"""Step 2 of a model's life (``ManagedModel.live``): one child, from spawn to exit, and how it ended.

The child is spawned, its saved context restored (:mod:`._context_steps`), the model announced
ready and the watchers (:mod:`._watchers`) started until the child exits. Its end is one of
:class:`~..process.Outcome`'s: a crash (its exit, and what its log says about why), a start that
did not come up (failed at once where a restart cannot fix the input), or a requested stop.
Kept apart from :mod:`._managed` for size: these are the model's own steps, and they set its
state as its methods do.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import anyio

from ..._errors import StartFailed
from ...hardware import cpu_flags
from ...process import ModelServer, Outcome, describe_returncode, unwrap_group
from .._events import EventKind
from ..backends._backends import backend_of
from ._context_steps import restore_context
from ._status import ModelState, SupervisedModel
from ._watchers import watch_health, watch_progress, watch_sleep, watch_ttl

if TYPE_CHECKING:
    from ..launch._launch import LaunchPlan

__all__ = ["run_child"]

log = logging.getLogger("rocmforge.supervisor")

#: Start failures that a restart cannot fix: the model fails at once, with the reason.
_FATAL_START = frozenset(
    {"file_not_found", "invalid_model", "unsupported", "bad_args", "illegal_instruction", "amx_fault"}
)


async def run_child(m: SupervisedModel, plan: LaunchPlan) -> Outcome:
    """Step 2: one child, from spawn to exit. Returns how it ended."""
    m.plan = plan
    server = ModelServer(plan.spec)
    m.server = server
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(server.run)
            if not m.stopping():  # a stop asked during the load: never announced ready
                await restore_context(m, server, plan)
                _on_ready(m, server)
            tg.start_soon(watch_health, m, server)
            if backend_of(m.config).has_slots:  # whisper-server, a command: no /slots to watch
                tg.start_soon(watch_progress, m, server)
            tg.start_soon(watch_ttl, m)
            if m.config.sleep_idle:
                tg.start_soon(watch_sleep, m, server)
            await server.exited.wait()
            tg.cancel_scope.cancel()
    except BaseException as exc:
        inner = unwrap_group(exc)
        if server.died_unasked and isinstance(inner, Exception) and not isinstance(inner, StartFailed):
            # Something broke while the child was dying (an unmapped error from a
            # connection to it). The child's own exit is the reason; the error goes to the log.
            log.warning("model %s: %r as its child died", m.name, inner, exc_info=inner)
            return _crashed(m, server)
        return _start_failed(m, inner, exc)
    return _crashed(m, server)


def _crashed(m: SupervisedModel, server: ModelServer) -> Outcome:
    """The child is gone: its exit (and what its log says about why) is the crash's reason."""
    if m.stopping():
        return Outcome.STOPPED
    how = describe_returncode(server.returncode)
    if m.kill_reason is not None:  # we killed it (a stall): that is the cause
        how, m.kill_reason = f"{how}: {m.kill_reason}", None
    # What its log and its exit say about why (an RPC worker it placed layers on died; a CPU
    # fault): the kind's crash advice.
    cause = server.crash_cause(amx="amx_int8" in cpu_flags())
    m.last_error = f"llama-server {how}" + (f": {cause}" if cause else "")
    m.last_stderr = server.log.tail(15)
    m.events.publish(m.name, EventKind.CRASH, returncode=server.returncode, message=m.last_error)
    log.warning("model %s: child %s", m.name, how, extra={"model": m.name})
    if m.ready_since:
        m.restart.ran_for(time.monotonic() - m.ready_since)  # stable long enough: start over
    return Outcome.CRASHED


def _on_ready(m: SupervisedModel, server: ModelServer) -> None:
    # Recovered: the last crash is history (``last_crash``, the events, ``restarts``), not
    # the model's present error.
    if m.last_error is not None:
        m.last_crash = m.last_error
    m.last_error, m.failure_kind = None, None
    m.warming = False  # loaded: its restarts place it like any start
    m._warm_cause = None
    m.load_seconds = server.load_seconds
    m.ready_since = m.last_used = time.monotonic()
    m._set_state(ModelState.READY, pid=server.pid, port=server.port, load_seconds=server.load_seconds)
    for cb in m.on_ready:
        cb(m)


def _start_failed(m: SupervisedModel, inner: BaseException, exc: BaseException) -> Outcome:
    """A start that did not come up (or a bug while supervising)."""
    if not isinstance(inner, StartFailed):
        if isinstance(inner, Exception):  # a bug: fail this model, keep the service
            log.exception("model %s: supervision failed", m.name, exc_info=inner)
            m._fail(f"internal error: {inner!r}", [], kind="internal")
            return Outcome.FAILED
        raise exc  # cancellation and the like: not ours to handle
    if m.stopping():  # a requested stop during the load is no crash
        return Outcome.STOPPED
    m.last_error = str(inner)
    m.last_stderr = inner.stderr_tail
    m.events.publish(m.name, EventKind.CRASH, reason=inner.reason, message=inner.message)
    if inner.reason in _FATAL_START:  # restarting cannot fix the input
        m._fail(str(inner), inner.stderr_tail, kind=inner.reason)
        return Outcome.FAILED
    return Outcome.CRASHED
