"""SSE keep-alive comments while a stream waits for its first token (queue, or a long prefill).

Reverse proxies and clients with read timeouts cut a stream that is silent for too long
(lemonade#1364); llama-server's own ``:`` ping comes only after 30 s. So while a streamed request
waits — for a slot in the gateway's queue, for llama-server's response headers, or for the first
event after them — the client gets ``: keep-alive\\n\\n`` every ``interval`` seconds. A comment is a
line every SSE parser skips (WHATWG "event stream interpretation"), and it is only ever sent before
the first byte of the body, so never inside a JSON event. After the first chunk the relay is plain
(llama-server's own ``:`` ping covers later gaps).

The status code stays honest where it can: if the upstream answers within the first ``interval``
(as every validation error does), its real status and body go out unchanged. Only a request that
has been silent for ``interval`` seconds is committed to ``200 text/event-stream``; an error after
that arrives as the dialect's SSE error event (what llama-server itself does for errors after the
first token). Waiting for a *loading* model is not covered: that wait ends in a real 503 with
``Retry-After`` (see ``load_wait``), so callers start this only once the model is ready.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
from starlette.types import Receive, Scope, Send

from ._routes import Dialect

__all__ = ["KEEPALIVE", "KeepAliveStream", "Opened", "sse_error_event"]

KEEPALIVE = b": keep-alive\n\n"


@dataclass
class Opened:
    """What the opener got: a status, headers, the body (chunks) and how to release it."""

    status: int
    headers: dict[str, str]
    body: AsyncIterator[bytes]
    close: Callable[[], Awaitable[None]]
    stream: bool = True  # False: a complete (error) body — sent as-is when still possible
    extra: dict[str, Any] = field(default_factory=dict)


def sse_error_event(dialect: Dialect, body: bytes) -> bytes:
    """An error body (already in the dialect's shape) as the dialect's SSE error event."""
    try:
        json.loads(body)
    except ValueError:
        body = json.dumps(
            {"error": {"message": body.decode("utf-8", "replace")[:500], "type": "server_error"}}
        ).encode()
    if dialect == "anthropic":
        return b"event: error\ndata: " + body + b"\n\n"
    return b"data: " + body + b"\n\n"


class KeepAliveStream:
    """An ASGI response: opens the upstream in the background and keeps the client's stream alive."""

    def __init__(
        self,
        opener: Callable[[], Awaitable[Opened]],
        *,
        interval: float,
        dialect: Dialect,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.opener = opener
        self.interval = interval
        self.dialect = dialect
        self.headers = headers or {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # The request's own task opens the upstream and relays its body; a side task pings only
        # until the first chunk. (A pump task feeding every chunk through a memory stream cost
        # ~0.05 ms of CPU per chunk: scripts/bench/bench_gateway.py's ceiling, cProfile.)
        opened: list[Opened] = []
        started = False  # http.response.start has gone out
        lock = anyio.Lock()
        pinging = anyio.CancelScope()

        async def ping() -> None:
            nonlocal started
            with pinging:
                while True:
                    await anyio.sleep(self.interval)
                    async with lock:  # cancelled (under this lock) once the request's task sends
                        if not started:  # silent for `interval`: committed to 200 now
                            head = opened[0].headers if opened else {}
                            await send(
                                {"type": "http.response.start", "status": 200, "headers": self._headers(head)}
                            )
                            started = True
                        await send({"type": "http.response.body", "body": KEEPALIVE, "more_body": True})

        async def watch_disconnect(scope_to_cancel: anyio.CancelScope) -> None:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    scope_to_cancel.cancel()
                    return

        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(watch_disconnect, tg.cancel_scope)
                tg.start_soon(ping)
                result = await self.opener()
                opened.append(result)
                whole = not result.stream or result.status != 200
                async with lock:
                    as_is = whole and not started  # its real status and body still can go out
                    if as_is:
                        pinging.cancel()
                    elif not started:
                        await send(
                            {
                                "type": "http.response.start",
                                "status": 200,
                                "headers": self._headers(result.headers),
                            }
                        )
                        started = True
                if as_is:
                    await self._send_whole(result, send)
                else:
                    await self._relay(result, whole, send, lock, pinging)
                tg.cancel_scope.cancel()
        finally:
            if opened:
                with anyio.CancelScope(shield=True):
                    await opened[0].close()

    def _headers(self, upstream: dict[str, str]) -> list[tuple[bytes, bytes]]:
        h = {"content-type": "text/event-stream", "cache-control": "no-cache", "x-accel-buffering": "no"}
        h.update({k.lower(): v for k, v in upstream.items()})
        h.update({k.lower(): v for k, v in self.headers.items()})
        return [(k.encode(), v.encode("latin-1")) for k, v in h.items()]

    async def _send_whole(self, result: Opened, send: Send) -> None:
        """A complete body (an error, usually) with its own status."""
        body = b"".join([c async for c in result.body])
        headers = {**result.headers, **self.headers, "content-length": str(len(body))}
        await send(
            {
                "type": "http.response.start",
                "status": result.status,
                "headers": [(k.lower().encode(), v.encode("latin-1")) for k, v in headers.items()],
            }
        )
        await send({"type": "http.response.body", "body": body, "more_body": False})

    async def _relay(
        self, result: Opened, whole: bool, send: Send, lock: anyio.Lock, pinging: anyio.CancelScope
    ) -> None:
        """The first chunk (the first token, or an error) while the pings go on; then the pings
        stop and the rest is a plain relay (llama-server's own ``:`` ping covers later gaps)."""
        chunks = result.body.__aiter__()
        try:
            first = await chunks.__anext__()
        except StopAsyncIteration:
            first = b""
        async with lock:  # a ping in flight finishes before the first chunk goes out
            pinging.cancel()
        if whole:  # committed to 200 already: the error becomes the dialect's SSE error event
            rest = first + b"".join([c async for c in chunks])
            event = sse_error_event(self.dialect, rest)
            await send({"type": "http.response.body", "body": event, "more_body": True})
        elif first:
            await send({"type": "http.response.body", "body": first, "more_body": True})
            async for chunk in chunks:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
