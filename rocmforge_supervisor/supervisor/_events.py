"""Model state events: one stream that the control API, `forge load`'s progress and logs all read."""

from __future__ import annotations

import collections
import itertools
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

__all__ = ["Event", "EventBus"]

log = logging.getLogger("rocmforge.events")


@dataclass(frozen=True)
class Event:
    seq: int
    time: float
    model: str
    kind: str  # "state", "restart", "crash", "config", "evict", "log"
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

    def publish(self, model: str, kind: str, state: str | None = None, **data: Any) -> Event:
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
