"""Model state events: one stream that the control API, `forge load`'s progress and logs all read."""

from __future__ import annotations

import collections
import itertools
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from ..process import ChildEvent

__all__ = ["Event", "EventBus", "EventKind"]

log = logging.getLogger("rocmforge.events")


class EventKind(StrEnum):
    """What an event says (a ``str``: the control API's event stream sends it as is). A child's
    crash and restart are :class:`ChildEvent`'s words, which ``forge worker`` says too."""

    STATE = "state"  # a model changed state (``Event.state`` is the new one)
    CRASH = ChildEvent.CRASH.value  # its child died, at load or later
    RESTART = ChildEvent.RESTART.value  # a restart is scheduled after a backoff
    HANG = "hang"  # its child stopped answering /health and is killed
    STALL = "stall"  # its child was busy without progress for stall_timeout and is killed
    TTL = "ttl"  # idle for its ttl: unloaded
    EVICT = "evict"  # unloaded to make room for another model
    PRESSURE = "pressure"  # unloaded to yield device memory to another program (vram_reserve)
    SLEEP = "sleep"  # its child freed (sleeping: true) or reloaded (false) the model (sleep_idle)
    READY = "ready"  # the supervisor is up, preloads done (model "*")
    CONFIG = "config"  # a reload was applied (model "*")
    CONFIG_REJECTED = (
        "config_rejected"  # watch_config: a changed file failed validation; the old config stays ("*")
    )
    RESTART_REQUIRED = "restart_required"  # a reload changed [server] keys only a restart applies ("*")
    LOG = "log"  # one line of a child's log (the log bus only)
    WAITING = "waiting"  # its RPC workers, or its group's members, are busy: the start waits and re-plans
    REFUSED = "refused"  # a residency rule refused its load (409): ``rule`` names it
    WARM = "warm"  # the warm default is loaded back without a request (``default = true``)
    CONTEXT_SAVED = "context_saved"  # keep_context: a slot was saved at a planned stop
    CONTEXT_RESTORED = "context_restored"  # keep_context: a saved slot was restored at a start
    CONTEXT_DELETED = "context_deleted"  # a saved slot was deleted (mismatch, budget, forget, unusable)
    FALLBACK = "fallback"  # a request the model could not take went to its fallback (``to``)
    PEER = "peer"  # a peer was cooled down after it failed, or answers again (model: the peer)
    CONTEXT_WARNING = "context_warning"  # a save or restore failed or was dropped: a cold start follows


@dataclass(frozen=True)
class Event:
    seq: int
    time: float
    model: str
    kind: EventKind
    state: str | None = None
    data: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class EventBus:
    """Fan-out to subscribers with bounded buffers: a slow subscriber is dropped, never waited for."""

    def __init__(self, history: int = 200, buffer: int = 256) -> None:
        self._seq = itertools.count(1)
        self._history: collections.deque[Event] = collections.deque(maxlen=history)
        self._subscribers: set[MemoryObjectSendStream[Event]] = set()
        self._buffer = buffer

    def publish(self, model: str, kind: EventKind, state: str | None = None, **data: Any) -> Event:
        ev = Event(next(self._seq), time.time(), model, kind, state, data)
        self._history.append(ev)
        for send in list(self._subscribers):
            try:
                send.send_nowait(ev)
            except anyio.WouldBlock:
                log.warning("dropping a slow event subscriber")
                self._subscribers.discard(send)
                send.close()
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                self._subscribers.discard(send)
        return ev

    @property
    def listened(self) -> bool:
        """Someone subscribes now (what was published with nobody listening is only history)."""
        return bool(self._subscribers)

    def history(self, model: str | None = None) -> list[Event]:
        return [e for e in self._history if model is None or e.model == model]

    @asynccontextmanager
    async def subscribe(self, replay: bool = False) -> AsyncIterator[MemoryObjectReceiveStream[Event]]:
        send, receive = anyio.create_memory_object_stream[Event](self._buffer)
        if replay:
            for ev in self._history:
                send.send_nowait(ev)
        self._subscribers.add(send)
        try:
            async with receive:
                yield receive
        finally:
            self._subscribers.discard(send)
            send.close()
