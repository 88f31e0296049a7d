"""Endless responses (``/api/events``, ``logs?follow=1``) that end when the service starts stopping.

uvicorn's graceful shutdown waits for every open response; an endless one made it wait the whole
grace period (~31 s) and then cancel it mid-write, with ``CancelledError`` tracebacks. These end
cleanly — last chunk, connection closed — the moment the gateway's ``closing`` event is set.
Finite answers (chat streams) are not these: they drain.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterable
from typing import Any

import anyio
from starlette.responses import StreamingResponse
from starlette.types import Message, Receive, Scope, Send

__all__ = ["LiveStream"]


class LiveStream(StreamingResponse):
    """A StreamingResponse that stops its body iterator when ``closing`` is set, then ends the body."""

    def __init__(self, content: AsyncIterable[bytes], closing: anyio.Event, **kw: Any) -> None:
        super().__init__(content, **kw)
        self._closing = closing

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = ended = False

        async def tracked(message: Message) -> None:
            nonlocal started, ended
            if message["type"] == "http.response.start":
                started = True
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                ended = True
            await send(message)

        async with anyio.create_task_group() as tg:

            async def stop_at_shutdown() -> None:
                await self._closing.wait()
                tg.cancel_scope.cancel()

            tg.start_soon(stop_at_shutdown)
            await super().__call__(scope, receive, tracked)
            tg.cancel_scope.cancel()
        if started and not ended and self._closing.is_set():
            with contextlib.suppress(OSError):  # the client went away meanwhile
                await send({"type": "http.response.body", "body": b"", "more_body": False})
