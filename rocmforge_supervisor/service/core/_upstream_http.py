"""The relay's streaming upstream: a small HTTP/1.1 client for a child's streamed answers only.

Why not httpx here: at the CPU ceiling (32 streams of the tiny GGUF,
``scripts/bench/bench_gateway.py``) httpx/httpcore/h11 reading each HTTP chunk of a child's SSE
body was ~24 % of the gateway's CPU (cProfile), one h11 event and several layers of async
generators per chunk. This reads the socket in blocks and hands them to httptools' response
parser (llhttp, in C; uvicorn's own parser), yielding the payload of every chunk that arrived
together as one block, so the relay (and uvicorn's one socket write per ``send``) handles it once.
Measured (``scripts/bench/ab_relay.py``, the httpx relay vs a hand-written chunk parser
interleaved in one session, 7 rounds, medians): gateway CPU per streamed chunk 0.065 -> 0.034 ms
at 32 streams, 0.068 -> 0.050 ms at 64 (paired per round x0.50 / x0.71). A later change replaced the
hand-written parser (~120 lines) with httptools': see docs/benchmarks.md for that A/B. The
asyncio protocol below instead of anyio's socket stream: a further x0.84-0.89. asyncio only: it
runs on uvicorn's loop (uvloop or not), as the whole gateway does.

Only the hot path uses it: a streamed request to a local ``http://`` child. Everything else
(non-streamed requests and their watchdog retry, the Ollama API, TextModel) keeps httpx.

Kept from httpx so that nothing above it changes: failures are raised as httpx's exceptions
(``ConnectError``/``ConnectTimeout``, ``ReadError``, ``WriteError``, ``RemoteProtocolError``), so
:func:`~rocmforge_supervisor.client.map_httpx_errors` and its retry rule (``RETRYABLE``, once on a
fresh connection when no byte came back and the child lives) map them exactly as for
:func:`~rocmforge_supervisor.client.asend`; idle connections expire after ``KEEPALIVE_EXPIRY``
(under cpp-httplib's 5 s idle close). A connection goes back to its pool only after its response
was read to the last chunk's terminator: one closed early (the client left, a cancellation, an
error) is closed, so llama-server sees the socket go and cancels the task, and a pooled connection
never carries half a response.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator
from typing import cast
from urllib.parse import urlsplit

import anyio
import httptools
import httpx

from ...client import KEEPALIVE_EXPIRY, RETRYABLE, Upstream, map_httpx_errors

__all__ = ["StreamPool", "StreamResponse", "supports"]

_HIGH = 1 << 20  # bytes read ahead of the relay before reading pauses
_MAX_HEAD = 65536
_SAFE_PATH = re.compile(r"[!-~]+")  # printable ASCII, no space: sent as it is
_SAFE_VALUE = re.compile(r"[\t -~\x80-\xff]*")  # no CR, LF or NUL in a header value


def supports(upstream: Upstream, path: str) -> bool:
    """Whether this client can carry the request (a plain ``http://`` child, a path that needs no
    encoding); httpx carries any other."""
    return (
        upstream.peer is None  # a peer: httpx, with its timeouts
        and upstream.base_url.startswith("http://")
        and _SAFE_PATH.fullmatch(path) is not None
    )


class _Conn(asyncio.Protocol):
    """One kept-alive TCP connection to a child, as an asyncio protocol: every byte that arrived
    since the last read comes back from :meth:`recv` as one block (so chunks that arrived together
    are relayed with one ASGI ``send``), with no per-read stream machinery (anyio's socket stream
    returned one ``data_received`` per call, and cost more per read: see the module). Reading pauses while more than
    ``_HIGH`` bytes wait (a slow client), so the child is held back as httpx's pull reads did."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.idle_since = 0.0
        self._incoming = bytearray()
        self._waiter: asyncio.Future[None] | None = None
        self._eof = False
        self._lost: Exception | None = None
        self._paused = False
        #: The pool's idle list while the connection waits there: a server that closes it then
        #: (its 5 s idle close, or the child gone for good) takes it out, so no socket lingers.
        self.parked: list[_Conn] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's TCP transport is not an asyncio.Transport subclass; it has the same methods
        self.transport = cast("asyncio.Transport", transport)

    def data_received(self, data: bytes) -> None:
        self._incoming += data
        if len(self._incoming) > _HIGH and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool:
        self._eof = True
        self._wake()
        self._unpark()
        return False  # the transport closes itself

    def connection_lost(self, exc: Exception | None) -> None:
        self._eof = True
        self._lost = exc
        self._wake()
        self._unpark()

    def _unpark(self) -> None:
        if self.parked is not None:
            if self in self.parked:
                self.parked.remove(self)
            self.parked = None
            self.close()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    @property
    def usable(self) -> bool:
        """Idle and still open: nothing unread, no close from the server."""
        return not self._eof and not self._incoming and self.transport is not None

    def send(self, data: bytes) -> None:
        if self.transport is None or self.transport.is_closing():
            raise httpx.WriteError("the connection is closed")
        self.transport.write(data)

    async def recv(self) -> bytes:
        """Every byte that arrived since the last call (waiting for one); the peer closing the
        connection is ``RemoteProtocolError``, a socket error ``ReadError``."""
        while not self._incoming:
            if self._lost is not None:
                raise httpx.ReadError(str(self._lost) or type(self._lost).__name__)
            if self._eof:
                raise httpx.RemoteProtocolError("the server closed the connection")
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        data = bytes(self._incoming)
        self._incoming.clear()
        if self._paused and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        return data

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class _Parsed:
    """httptools' callbacks for one response: its head, the payload parts that arrived, the end."""

    __slots__ = ("begun", "done", "head_done", "headers", "parts")

    def __init__(self) -> None:
        self.headers: dict[str, str] = {}
        self.parts: list[bytes] = []
        self.head_done = False
        self.done = False
        self.begun = 0  # responses begun on this connection: a second one is bytes nobody asked for

    def on_message_begin(self) -> None:
        self.begun += 1

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1").strip()

    def on_headers_complete(self) -> None:
        self.head_done = True

    def on_body(self, body: bytes) -> None:
        self.parts.append(body)

    def on_message_complete(self) -> None:
        self.done = True


class _Reader:
    """One response read off a connection with httptools' parser (llhttp, C): the head, then the
    body's payload with the chunk framing removed, every part that arrived together as one block."""

    def __init__(self, conn: _Conn) -> None:
        self.conn = conn
        self.cb = _Parsed()
        self.parser = httptools.HttpResponseParser(self.cb)
        self.fed = 0
        self.extra = False  # bytes after the response's end: the connection is not reused
        #: A malformed body found while the head was read with it: raised where the body is read.
        self.error: httpx.RemoteProtocolError | None = None

    def feed(self, data: bytes) -> None:
        if self.cb.done:
            self.extra = self.extra or bool(data)
            return
        if not self.cb.head_done:
            self.fed += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            if self.cb.done:  # a second message after the end: not ours
                self.extra = True
                return
            error = httpx.RemoteProtocolError(f"malformed response from the child: {exc}")
            if not self.cb.head_done:
                raise error from None
            self.error = error
        if self.cb.begun > 1:
            self.extra = True
        if not self.cb.head_done and self.fed > _MAX_HEAD:
            raise httpx.RemoteProtocolError("the response head is larger than 64 KiB")

    def take(self) -> bytes:
        parts, self.cb.parts = self.cb.parts, []
        if not parts:
            return b""
        return parts[0] if len(parts) == 1 else b"".join(parts)


async def _read_head(conn: _Conn) -> _Reader:
    """The status line and headers; body bytes that came with them wait in the reader."""
    reader = _Reader(conn)
    while not reader.cb.head_done:
        reader.feed(await conn.recv())
    return reader


class StreamResponse:
    """A child's answer with its head read and its body not: the subset of ``httpx.Response`` the
    forwarder reads (``status_code``, ``headers`` with lower-case names, :meth:`aiter_raw`,
    :meth:`aread`, :meth:`aclose`)."""

    def __init__(self, pool: StreamPool, key: str, reader: _Reader) -> None:
        headers = reader.cb.headers
        status = reader.parser.get_status_code()
        if (
            reader.parser.get_http_version() == "1.0"
            and headers.get("connection", "").lower() != "keep-alive"
        ):
            headers.setdefault("connection", "close")
        self.status_code = status
        self.headers = headers
        self._pool = pool
        self._key = key
        self._reader: _Reader | None = reader
        self._reusable = headers.get("connection", "").lower() != "close"
        chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        no_body = status in (204, 304) or status < 200  # RFC 9112 6.3
        #: The body runs to the end of the connection (no length, not chunked): never reused.
        self._to_eof = not chunked and not no_body and "content-length" not in headers
        if self._to_eof:
            self._reusable = False

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        """The body's payload (chunk framing removed) in blocks: everything already read, at once."""
        reader = self._reader
        if reader is None:
            return
        while True:
            out = reader.take()
            if out:
                yield out
            if reader.error is not None:
                raise reader.error
            if reader.cb.done:
                return
            try:
                reader.feed(await reader.conn.recv())
            except httpx.RemoteProtocolError as exc:
                if "closed the connection" not in str(exc):
                    raise
                if self._to_eof:  # read to the end: complete
                    if out := reader.take():
                        yield out
                    reader.cb.done = True
                    return
                raise httpx.RemoteProtocolError(
                    "peer closed connection without sending complete message body: "
                    + (
                        "incomplete chunked read"
                        if "chunked" in self.headers.get("transfer-encoding", "").lower()
                        else "received fewer bytes than Content-Length"
                    )
                ) from None

    @property
    def complete(self) -> bool:
        """The body was read to its end (the connection may be reused)."""
        return self._reader is not None and self._reader.cb.done

    @property
    def connection(self) -> _Conn | None:
        """The connection it is read from; None once closed."""
        return self._reader.conn if self._reader is not None else None

    async def aread(self) -> bytes:
        return b"".join([block async for block in self.aiter_raw()])

    async def aclose(self) -> None:
        """Back to the pool if the whole response was read and the server keeps the connection;
        closed otherwise (a stream left early: the child sees the socket go and stops)."""
        reader, self._reader = self._reader, None
        if reader is None:
            return
        if reader.cb.done and self._reusable and not reader.extra:
            self._pool.put(self._key, reader.conn)
        else:
            reader.conn.close()


class StreamPool:
    """Kept-alive connections per child (``host:port``), newest first; idle ones expire."""

    def __init__(self, *, connect_timeout: float = 5.0, max_idle: int = 512) -> None:
        self.connect_timeout = connect_timeout
        self.max_idle = max_idle
        self._idle: dict[str, list[_Conn]] = {}
        self._addr: dict[str, tuple[str, int]] = {}
        self._closed = False

    def put(self, key: str, conn: _Conn) -> None:
        idle = self._idle.setdefault(key, [])
        if self._closed or len(idle) >= self.max_idle or not conn.usable:
            conn.close()
            return
        conn.idle_since = time.monotonic()
        conn.parked = idle
        idle.append(conn)

    async def aclose(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, {}
        for conns in idle.values():
            for c in conns:
                c.parked = None
                c.close()

    async def send(
        self, upstream: Upstream, method: str, path: str, *, content: bytes, headers: dict[str, str]
    ) -> StreamResponse:
        """Send and return the response with its head read; retried once on a fresh connection if
        no byte came back and the child still lives (the rule of ``client.asend``). Errors are
        mapped by ``map_httpx_errors`` (``ServerUnavailable``). The caller must close it."""
        key = upstream.base_url
        with map_httpx_errors(upstream, streaming=False):
            head = self._request(key, method, path, content, headers)
        for attempt in (1, 2):
            with map_httpx_errors(upstream, streaming=False):
                try:
                    return await self._send_once(key, head, fresh=attempt == 2)
                except RETRYABLE:
                    if attempt == 2 or not upstream.alive():
                        raise
        raise AssertionError("unreachable")

    def _request(self, key: str, method: str, path: str, content: bytes, headers: dict[str, str]) -> bytes:
        if key not in self._addr:
            url = urlsplit(key)
            self._addr[key] = (url.hostname or "127.0.0.1", url.port or 80)
        host, port = self._addr[key]
        lines = [f"{method} {path} HTTP/1.1", f"Host: {host}:{port}", f"Content-Length: {len(content)}"]
        for k, v in headers.items():
            if _SAFE_VALUE.fullmatch(v) is None or _SAFE_PATH.fullmatch(k) is None or ":" in k:
                raise httpx.LocalProtocolError(f"illegal header {k!r}")
            lines.append(f"{k}: {v}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + content

    async def _connect(self, key: str) -> _Conn:
        host, port = self._addr[key]
        try:
            with anyio.fail_after(self.connect_timeout):
                _, conn = await asyncio.get_running_loop().create_connection(_Conn, host, port)
                return conn
        except TimeoutError as exc:
            raise httpx.ConnectTimeout(
                f"no connection to {host}:{port} within {self.connect_timeout} s"
            ) from exc
        except OSError as exc:
            raise httpx.ConnectError(str(exc)) from exc

    def _pooled(self, key: str) -> _Conn | None:
        idle = self._idle.get(key)
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            conn.parked = None
            if now - conn.idle_since < KEEPALIVE_EXPIRY and conn.usable:
                return conn
            conn.close()
        return None

    async def _send_once(self, key: str, request: bytes, *, fresh: bool) -> StreamResponse:
        conn = None if fresh else self._pooled(key)
        if conn is None:
            conn = await self._connect(key)
        try:
            conn.send(request)
            reader = await _read_head(conn)
        except BaseException:
            conn.close()
            raise
        return StreamResponse(self, key, reader)
