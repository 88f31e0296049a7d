"""The one response a forwarded request goes out through: the answer relayed, its errors rendered.

:class:`RelayResponse` runs the request's *opener* (wait for the model's load, a slot, the child's
answer) inside the response, and then relays what it opened — a whole body with its own status,
or a stream chunk by chunk as the child sends it. A :class:`ForgeError` from the opener is
rendered here and only here, in the route's dialect: a real status and body while nothing has
been sent, the dialect's SSE error event once the response is committed.

**A client that leaves** (its connection closed: ``http.disconnect`` on ``receive``) cancels its
request at once, whole or streamed, in every dialect: the wait for a slot ends, the upstream
connection is closed (llama-server stops a task whose connection closed), the slot is given back.
A whole answer is awaited with nothing sent, so only ``receive`` can tell that its client is gone.

**Keep-alive** (``interval`` > 0, streamed requests): reverse proxies and clients with read
timeouts cut a stream that is silent for too long (lemonade#1364); llama-server's own ``:`` ping
comes only after 30 s. So while a streamed request waits — for a slot in the gateway's queue, for
llama-server's response headers, or for the first event after them — the client gets
``: keep-alive\\n\\n`` every ``interval`` seconds. A comment is a line every SSE parser skips
(WHATWG "event stream interpretation"), and it is only ever sent before the first byte of the
body, so never inside a JSON event. After the first chunk the relay is plain (llama-server's own
``:`` ping covers later gaps).

The status code stays honest where it can: if the opener answers within the first ``interval``
(as every validation error does), its real status and body go out unchanged. Only a request that
has been silent for ``interval`` seconds is committed to ``200 text/event-stream``. Waiting for a
*loading* model is never kept alive: that wait ends in a real 503 with ``Retry-After`` (see
``load_wait``), so the pings start only once the opener calls ``loaded`` (the model is ready, the
request waits for a slot or its first token).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import anyio
from starlette.types import Receive, Scope, Send

from ..._errors import ForgeError
from ..core._recording import note_answered, note_status
from ..core._routes import Dialect
from ..edge._errors_http import error_response, sse_error_chunk

__all__ = ["CLIENT_GONE", "KEEPALIVE", "Opened", "Opener", "RelayResponse"]

KEEPALIVE = b": keep-alive\n\n"
#: The status a request whose client left before any of its answer was sent is recorded with
#: (nginx's "client closed request"; nothing is sent: there is no one to send it to).
CLIENT_GONE = 499

_STREAM_HEADERS = {
    "content-type": "text/event-stream",
    "cache-control": "no-cache",
    "x-accel-buffering": "no",
}


async def _nothing() -> None:
    return None


def _never() -> bool:
    return False


@dataclass
class Opened:
    """What the opener got: a whole answer (``chunks`` None: ``content`` with ``status``), or a
    stream (``chunks``, relayed as they come); ``close`` releases the upstream however it ends."""

    status: int
    headers: dict[str, str]
    content: bytes = b""
    chunks: AsyncIterator[bytes] | None = None
    close: Callable[[], Awaitable[None]] = _nothing
    #: Whether the stream's end event has gone out to the client (read only when it leaves).
    ended: Callable[[], bool] = _never


#: Opens the upstream; calls its argument once the model is loaded (the keep-alive may start).
Opener = Callable[[Callable[[], None]], Awaitable[Opened]]


class _Head:
    """Whether the response has started, under the lock the ping and the relay share."""

    def __init__(self, send: Send, headers: Callable[[dict[str, str]], list[tuple[bytes, bytes]]]) -> None:
        self.send = send
        self.headers = headers
        self.started = False  # http.response.start has gone out
        # fast_acquire: the lock is uncontended but for a ping in flight, and anyio's default
        # checkpoint on every acquire yielded each stream's task once more before its first byte.
        self.lock = anyio.Lock(fast_acquire=True)
        self.stopped = False  # the request's task sends now: no ping after this

    async def ping(self, loaded: anyio.Event, interval: float) -> None:
        """Every ``interval`` s once the model is loaded: a comment (the first commits to 200).
        Stopped by a flag under the lock, not a cancel: cancelling an anyio scope formats the
        task's repr (~0.1 ms per stream at the ceiling, cProfile); the request's task group
        ends a ping still asleep."""
        await loaded.wait()
        while True:
            await anyio.sleep(interval)
            async with self.lock:
                if self.stopped:
                    return
                if not self.started:  # silent for `interval`: committed to 200 now
                    await self.start({})
                await self.send({"type": "http.response.body", "body": KEEPALIVE, "more_body": True})

    async def stop_pings(self) -> bool:
        """No ping after this one (a ping in flight finishes first); whether the response started."""
        async with self.lock:
            self.stopped = True
        return self.started

    async def start(self, upstream: dict[str, str]) -> None:
        await self.send({"type": "http.response.start", "status": 200, "headers": self.headers(upstream)})
        self.started = True


class RelayResponse:
    """An ASGI response: opens the upstream inside the response and relays it (see the module)."""

    def __init__(
        self,
        opener: Opener,
        *,
        dialect: Dialect,
        request_id: str | None,
        stream: bool,
        interval: float = 0.0,
        close: bool = False,
    ) -> None:
        self.opener = opener
        self.dialect = dialect
        self.request_id = request_id
        self.stream = stream
        self.interval = interval if stream else 0.0
        #: A streamed answer ends its connection (``Connection: close``; see the config's
        #: ``keep_alive_streams``); an error rendered before the stream began keeps it.
        self.close = close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # The request's own task opens the upstream and relays its body; side tasks watch for the
        # client leaving and (streams) ping only until the first chunk. (A pump task feeding every
        # chunk through a memory stream cost ~0.05 ms of CPU per chunk: the ceiling test of
        # scripts/bench/bench_gateway.py, cProfile.)
        opened: Opened | None = None
        head = _Head(send, self._headers)
        loaded = anyio.Event()
        answering = False  # the answer (or its error) is going out: a disconnect now ends nothing

        async def watch_disconnect(scope_to_cancel: anyio.CancelScope) -> None:
            """A client that leaves cancels its request at once, whole or streamed: the wait for a
            slot, or for the child's answer (its connection closed: llama-server stops the task),
            or the stream; the slot is freed. Its activity row says ``cancelled`` (the response
            did not end), with 499 for a status when nothing had been sent. A client that leaves
            once the stream's end event went out had its whole answer: the row says so."""
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    if not answering:
                        if not head.started:
                            note_status(CLIENT_GONE, "client_gone")
                        elif opened is not None and opened.ended():
                            note_answered()
                        scope_to_cancel.cancel()
                    return

        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(watch_disconnect, tg.cancel_scope)
                if self.interval > 0:
                    tg.start_soon(head.ping, loaded, self.interval)
                try:
                    opened = await self.opener(loaded.set)
                except ForgeError as exc:
                    answering = True
                    if await head.stop_pings():  # committed to 200 already: only an event is left
                        await _body(send, sse_error_chunk(exc, self.dialect), more=False)
                    else:
                        await error_response(exc, self.request_id, self.dialect)(scope, receive, send)
                    tg.cancel_scope.cancel()  # the side tasks (a cancel formats the task's repr)
                    return
                if opened.chunks is None:
                    answering = True
                    if await head.stop_pings():  # a whole answer after the commit: as an event
                        await _body(send, b"data: " + opened.content + b"\n\n", more=False)
                    else:
                        await self._send_whole(opened, send)
                else:
                    await self._relay(opened, opened.chunks, head)
                tg.cancel_scope.cancel()  # the side tasks
        finally:
            if opened is not None:
                with anyio.CancelScope(shield=True):
                    await opened.close()

    def _headers(self, upstream: dict[str, str]) -> list[tuple[bytes, bytes]]:
        h = dict(_STREAM_HEADERS)
        h.update({k.lower(): v for k, v in upstream.items()})
        if self.request_id:
            h["x-request-id"] = self.request_id
        if self.close:
            h["connection"] = "close"
        return [(k.encode(), v.encode("latin-1")) for k, v in h.items()]

    async def _send_whole(self, opened: Opened, send: Send) -> None:
        """A complete body with its own status (and its length)."""
        headers = {k.lower(): v for k, v in opened.headers.items()}
        if self.request_id:
            headers["x-request-id"] = self.request_id
        headers["content-length"] = str(len(opened.content))
        raw = [(k.encode(), v.encode("latin-1")) for k, v in headers.items()]
        await send({"type": "http.response.start", "status": opened.status, "headers": raw})
        await _body(send, opened.content, more=False)

    async def _relay(self, opened: Opened, chunks: AsyncIterator[bytes], head: _Head) -> None:
        """The first chunk (the first token, or an error event) while the pings go on; then the
        pings stop and the rest is a plain relay."""
        send = head.send
        it = chunks.__aiter__()
        try:
            first = await it.__anext__()
        except StopAsyncIteration:
            first = b""
        if not await head.stop_pings():
            await head.start(opened.headers)
        if first:
            await _body(send, first, more=True)
            async for chunk in it:  # the hot loop: one send per chunk, no helper call
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await _body(send, b"", more=False)


async def _body(send: Send, body: bytes, *, more: bool) -> None:
    await send({"type": "http.response.body", "body": body, "more_body": more})
