"""The relay's own HTTP/1.1 client (``service/core/_upstream_http``): its chunked parser against real
llama-server byte streams (h11, httpx's parser, is the oracle), the real child end to end (reuse of a
finished connection, a stream left early freeing the child's slot), and, through a *fake* upstream
(a TCP listener that writes scripted bytes: a real child never sends a malformed chunk), every way
a body can break, each raised as the httpx error that ``map_httpx_errors`` maps (the message is httptools' own)."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import anyio.abc
import h11
import httpx
import pytest

from rocmforge_supervisor._errors import ServerUnavailable
from rocmforge_supervisor.client import Upstream
from rocmforge_supervisor.process import InstanceSpec, ModelServer
from rocmforge_supervisor.service.core._upstream_http import StreamPool, StreamResponse, _Conn, _read_head

pytestmark = pytest.mark.anyio

BODY = b'{"prompt":"Once upon a time","max_tokens":24,"stream":true,"temperature":0}'


class _Pieces(_Conn):
    """A connection whose reads return the given pieces, then EOF (the parser's input, split on cue)."""

    def __init__(self, pieces: list[bytes]) -> None:
        super().__init__()
        self.pieces = list(pieces)

    async def recv(self) -> bytes:
        if not self.pieces:
            raise httpx.RemoteProtocolError("the server closed the connection")
        return self.pieces.pop(0)


async def _parse(pieces: list[bytes]) -> tuple[StreamResponse, list[bytes]]:
    pool = StreamPool()
    conn = _Pieces(pieces)
    response = StreamResponse(pool, "k", await _read_head(conn))
    return response, [block async for block in response.aiter_raw()]


def _h11_body(raw: bytes) -> bytes:
    """What h11 (httpx's parser) reads as the body of ``raw``, and that it reads it as complete."""
    c = h11.Connection(our_role=h11.CLIENT)
    c.send(h11.Request(method="POST", target="/", headers=[("Host", "x"), ("Content-Length", "0")]))
    c.send(h11.EndOfMessage())
    c.receive_data(raw)
    out = b""
    while True:
        event = c.next_event()
        if isinstance(event, h11.Data):
            out += event.data
        elif isinstance(event, h11.EndOfMessage):
            return out
        elif event is h11.NEED_DATA:
            raise AssertionError("h11 says the response is incomplete")


def _spec(binary: Path, model: Path, tmp_path: Path) -> InstanceSpec:
    return InstanceSpec(
        binary=binary,
        model_path=model,
        alias="m",
        ctx_size=512,
        cpu_only=True,
        log_path=tmp_path / "m.log",
        state_dir=tmp_path / "state",
        stop_timeout=5.0,
        extra_args=["--parallel", "1"],
    )


async def _wire_bytes(server: ModelServer, body: bytes) -> bytes:
    """One streamed answer exactly as the child writes it (head, chunk framing and all)."""
    host, port = server.base_url.removeprefix("http://").split(":")
    request = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n"
        f"Authorization: Bearer {server.api_key}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    raw = b""
    with anyio.fail_after(30):
        async with await anyio.connect_tcp(host, int(port)) as s:
            await s.send(request)
            try:
                while True:
                    raw += await s.receive()
            except anyio.EndOfStream:
                pass
    return raw


async def test_real_stream_parses_as_h11_does_in_any_split(
    llama_server_bin: Path, tiny_gguf: Path, tmp_path: Path
) -> None:
    async with ModelServer(_spec(llama_server_bin, tiny_gguf, tmp_path)) as server:
        raw = await _wire_bytes(server, BODY)
    assert b"Transfer-Encoding: chunked" in raw  # what the parser is for: llama-server's SSE framing
    expected = _h11_body(raw)
    assert expected.endswith(b"data: [DONE]\n\n")
    head = raw.index(b"\r\n\r\n") + 4
    # whole; one byte at a time; cut at every offset of the body (a size line, CRLF or data split)
    splits = [[raw], [raw[i : i + 1] for i in range(len(raw))]]
    splits += [[raw[:cut], raw[cut:]] for cut in range(head, len(raw))]
    for pieces in splits:
        response, blocks = await _parse(pieces)
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        assert b"".join(blocks) == expected
        assert response.complete
    # everything that arrived together comes out as one block
    _, blocks = await _parse([raw])
    assert blocks == [expected]


async def test_real_child_reuses_a_finished_connection_and_a_left_stream_frees_the_slot(
    llama_server_bin: Path, tiny_gguf: Path, tmp_path: Path
) -> None:
    pool = StreamPool()
    async with ModelServer(_spec(llama_server_bin, tiny_gguf, tmp_path)) as server:
        up = Upstream(server.base_url, server.api_key)
        headers = up.headers({"Content-Type": "application/json"})
        with anyio.fail_after(60):
            r = await pool.send(up, "POST", "/v1/completions", content=BODY, headers=headers)
            body = await r.aread()
            await r.aclose()
            assert body.endswith(b"data: [DONE]\n\n")
            assert len(pool._idle[up.base_url]) == 1  # read to its end: back in the pool
            # A stream that would run for minutes on the child's only slot, left after one block:
            # its connection is closed (never pooled), so the child cancels it and the next
            # request gets the slot.
            endless = b'{"prompt":"a","max_tokens":100000,"ignore_eos":true,"stream":true}'
            r = await pool.send(up, "POST", "/v1/completions", content=endless, headers=headers)
            assert pool._idle[up.base_url] == []  # the pooled connection carried it
            async for _ in r.aiter_raw():
                break
            await r.aclose()
            assert pool._idle[up.base_url] == []  # half read: closed, not pooled
            r = await pool.send(up, "POST", "/v1/completions", content=BODY, headers=headers)
            assert (await r.aread()).endswith(b"data: [DONE]\n\n")
            await r.aclose()
    await pool.aclose()


@asynccontextmanager
async def _fake_upstream(
    *answers: bytes, hold: anyio.Event | None = None
) -> AsyncIterator[tuple[Upstream, list[int]]]:
    """A fake child: for each connection, read the request head, write the next scripted answer
    and close (once ``hold`` is set, if given). Returns its upstream and a count of connections."""
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    accepted = [0]
    script = list(answers)

    async def serve(client: anyio.abc.SocketStream) -> None:
        async with client:
            accepted[0] += 1
            data = b""
            try:
                while b"\r\n\r\n" not in data:
                    data += await client.receive()
                if script:
                    await client.send(script.pop(0))
                if hold is not None:
                    await hold.wait()
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                pass

    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, serve)
        try:
            yield Upstream(f"http://127.0.0.1:{port}"), accepted
        finally:
            tg.cancel_scope.cancel()


HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        (HEAD + b"zz\r\ndata\r\n", "Invalid character in chunk size"),
        (HEAD + b"-5\r\nhello\r\n", "Invalid character in chunk size"),
        (HEAD + b"5\r\nhelloXX", "Expected LF after chunk data"),
        (HEAD + b"a\r\nhello", "incomplete chunked read"),  # closed mid-chunk
        (HEAD + b"5\r\nhello\r\n", "incomplete chunked read"),  # closed before the last chunk
        (HEAD + b"5", "incomplete chunked read"),  # closed in a size line
        (HEAD + b"1" * 5000, "Chunk size overflow"),
    ],
)
async def test_fake_upstream_broken_bodies_are_httpx_protocol_errors(answer: bytes, error: str) -> None:
    pool = StreamPool()
    async with _fake_upstream(answer) as (up, _):
        with anyio.fail_after(10):
            r = await pool.send(up, "POST", "/x", content=b"{}", headers={})
            with pytest.raises(httpx.RemoteProtocolError, match=error):
                async for _ in r.aiter_raw():
                    pass
            await r.aclose()
    assert pool._idle.get(up.base_url, []) == []
    await pool.aclose()


async def test_fake_upstream_content_length_answer_and_no_head() -> None:
    pool = StreamPool()
    error = (
        b"HTTP/1.1 400 Bad Request\r\nConnection: close\r\nContent-Type: application/json\r\n"
        b'Content-Length: 11\r\n\r\n{"error":1}'
    )
    async with _fake_upstream(error, b"", b"") as (up, accepted):
        with anyio.fail_after(10):
            r = await pool.send(up, "POST", "/x", content=b"{}", headers={})
            assert r.status_code == 400
            assert await r.aread() == b'{"error":1}'
            await r.aclose()
            assert pool._idle.get(up.base_url, []) == []  # "Connection: close": not pooled
            # closed before any byte, twice: retried once on a fresh connection, then unavailable
            before = accepted[0]
            with pytest.raises(ServerUnavailable, match="cannot reach"):
                await pool.send(up, "POST", "/x", content=b"{}", headers={})
            assert accepted[0] - before == 2
    await pool.aclose()


async def test_nothing_listening_is_server_unavailable() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    pool = StreamPool()
    with anyio.fail_after(10), pytest.raises(ServerUnavailable, match="cannot reach"):
        await pool.send(Upstream(f"http://127.0.0.1:{port}"), "POST", "/x", content=b"", headers={})


async def test_header_injection_is_refused_before_sending() -> None:
    pool = StreamPool()
    with pytest.raises(ServerUnavailable, match="illegal header"):
        await pool.send(
            Upstream("http://127.0.0.1:1"), "POST", "/x", content=b"", headers={"X-Request-ID": "a\r\nB: c"}
        )


async def test_fake_upstream_closing_an_idle_connection_takes_it_out_of_the_pool() -> None:
    ok = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
    pool = StreamPool()
    close = anyio.Event()
    async with _fake_upstream(ok, hold=close) as (up, _):
        with anyio.fail_after(10):
            r = await pool.send(up, "POST", "/x", content=b"{}", headers={})
            assert await r.aread() == b"{}"
            await r.aclose()
            idle = pool._idle[up.base_url]
            assert len(idle) == 1  # read whole, kept alive: parked
            close.set()
            while idle:  # noqa: ASYNC110 — the protocol callback of the server closing it takes it out
                await anyio.sleep(0.01)
    await pool.aclose()


async def test_fake_upstream_reading_pauses_while_the_relay_is_behind() -> None:
    """A slow client: past 1 MiB read ahead, the socket is not read (the child is held back by
    TCP, as httpx's pull reads held it); reading the backlog resumes it, and nothing is lost."""
    block = b"x" * 65536
    body = (b"10000\r\n" + block + b"\r\n") * 48 + b"0\r\n\r\n"  # 3 MiB in 64 KiB chunks
    pool = StreamPool()
    async with _fake_upstream(HEAD + body) as (up, _):
        with anyio.fail_after(20):
            r = await pool.send(up, "POST", "/x", content=b"{}", headers={})
            conn = r.connection
            assert conn is not None
            while not conn._paused:  # noqa: ASYNC110 — set by the protocol's data_received
                await anyio.sleep(0.01)
            assert len(conn._incoming) < 2 * (1 << 20)
            got = b"".join([b async for b in r.aiter_raw()])
            assert got == block * 48 and not conn._paused
            await r.aclose()
    await pool.aclose()
