"""Streams through the gateway, in-process against the fake llama-server: a client that leaves
mid-stream (the upstream request is cancelled, the slot freed, no task left behind), and the
``: keep-alive`` comments while a first token is late (``sse_keepalive`` > 0; none when 0)."""

from __future__ import annotations

import asyncio
from typing import Any

import anyio
import pytest

from tests.gateway_fast.conftest import Serve
from tests.gateway_fast.dialects import Dialect, chat, error_of
from tests.support.gateway import Gateway, poll, tasks

pytestmark = pytest.mark.anyio

KEEPALIVE = b": keep-alive\n\n"


async def _read_then_leave(gw: Gateway, path: str, body: dict[str, Any], until: bytes) -> None:
    """Stream the request until a chunk holds ``until``, then hang up (the connection closes)."""
    async with gw.client.stream("POST", path, json=body) as r:
        assert r.status_code == 200
        async for chunk in r.aiter_raw():
            if until in chunk:
                return
    raise AssertionError(f"the stream ended without {until!r}")


async def _no_task_left(before: set[asyncio.Task[object]]) -> None:
    await poll(lambda: not (tasks() - before), what=f"the request's tasks to end: {tasks() - before}")


@pytest.mark.parametrize(
    ("dialect", "keepalive"),
    [("openai", 0), ("openai", 0.1), ("anthropic", 0), ("anthropic", 0.1), ("ollama", 0)],
)
async def test_a_client_that_leaves_mid_stream_cancels_the_upstream_and_frees_the_slot(
    serve: Serve, dialect: Dialect, keepalive: float
) -> None:
    """One slot (max_concurrency 1, queue 0), a long slow stream, the client reads one chunk and
    hangs up: the child sees its client go, the slot is free for the next request at once (not
    a 429), and every task the request started has ended."""
    slow = ["--fake-chunks", "500", "--fake-token-delay", "0.02"]
    models = {"m": {"preload": True, "max_concurrency": 1, "queue": 0, "args": slow}}
    async with serve(models, server={"sse_keepalive": keepalive}) as gw:
        m = gw.model("m")
        path, body = chat(dialect, "m", stream=True)
        before = tasks()
        await _read_then_leave(gw, path, body, b"tok0")
        await poll(lambda: "client closed the stream" in gw.child_log("m"), what="the child to see it")
        assert m.in_flight == 0 and m.waiting == 0
        await _no_task_left(before)
        assert m.requests_total == 1
        with anyio.fail_after(5):
            again = await gw.client.post(path, json={**body, "stream": False})
        assert again.status_code == 200, again.text  # the slot was given back


@pytest.mark.parametrize("dialect", ["openai", "anthropic"])
async def test_a_client_that_leaves_during_the_keep_alive_wait_frees_its_slot_at_once(
    serve: Serve, dialect: Dialect
) -> None:
    """The stream is committed by its first comment while the child has not answered yet (a
    first token 30 s away); the client leaves then: the wait for the child is cancelled — the
    slot comes back long before the child would have answered — and no task is left."""
    models = {"m": {"preload": True, "args": ["--fake-first-token-delay", "30"]}}
    async with serve(models, server={"sse_keepalive": 0.05}) as gw:
        m = gw.model("m")
        path, body = chat(dialect, "m", stream=True)
        before = tasks()
        await _read_then_leave(gw, path, body, KEEPALIVE)
        await poll(lambda: m.in_flight == 0, timeout=5, what="the slot back after the client left")
        await _no_task_left(before)


@pytest.mark.parametrize("dialect", ["openai", "anthropic"])
async def test_a_late_first_token_gets_keep_alive_comments_then_the_whole_stream(
    serve: Serve, dialect: Dialect
) -> None:
    models = {"m": {"preload": True, "args": ["--fake-first-token-delay", "0.5"]}}
    async with serve(models, server={"sse_keepalive": 0.1}) as gw:
        path, body = chat(dialect, "m", stream=True)
        r = await gw.client.post(path, json=body)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        head, _, events = r.content.partition(b"event: " if dialect == "anthropic" else b"data: ")
        assert head.count(KEEPALIVE) >= 2 and head == KEEPALIVE * head.count(KEEPALIVE), head
        assert KEEPALIVE not in events  # only ever before the first event
        end = b"message_stop" if dialect == "anthropic" else b"data: [DONE]"
        assert end in r.content.rstrip().rsplit(b"\n\n", 1)[-1]


async def test_with_the_interval_zero_a_late_first_token_gets_no_comment(serve: Serve) -> None:
    models = {"m": {"preload": True, "args": ["--fake-first-token-delay", "0.3"]}}
    async with serve(models, server={"sse_keepalive": 0}) as gw:
        path, body = chat("openai", "m", stream=True)
        r = await gw.client.post(path, json=body)
        assert r.status_code == 200
        assert r.content.startswith(b"data: {") and b"keep-alive" not in r.content
        assert r.content.rstrip().endswith(b"data: [DONE]")


async def test_an_error_within_the_interval_keeps_its_status_and_one_after_it_is_an_event(
    serve: Serve,
) -> None:
    """The upstream's error before the first comment goes out as itself (a 500); after the
    stream was committed to 200 by a comment, it can only be the dialect's SSE error event."""
    # A whole second for the quick error to come back within, on a busy machine too.
    quick = {"preload": True, "args": ["--fake-error", "500"]}
    late = {"preload": True, "args": ["--fake-error", "500", "--fake-first-token-delay", "1.5"]}
    async with serve({"quick": quick, "late": late}, server={"sse_keepalive": 1.0}) as gw:
        path, body = chat("openai", "quick", stream=True)
        r = await gw.client.post(path, json=body)
        assert r.status_code == 500 and "fake failure" in error_of("openai", r.json())[0]

        r = await gw.client.post(path, json={**body, "model": "late"})
        assert r.status_code == 200 and r.content.startswith(KEEPALIVE)
        event = r.content.rstrip().rsplit(b"\n\n", 1)[-1]
        assert event.startswith(b"data: {") and b"fake failure" in event and b"[DONE]" not in r.content


def _local_port(r: Any) -> int:
    """The client's own port of the connection a response came on (a new one: a new port)."""
    port: int = r.extensions["network_stream"].get_extra_info("client_addr")[1]
    return port


@pytest.mark.parametrize("keep", [False, True])
async def test_a_streamed_answer_ends_its_connection_unless_keep_alive_streams(
    serve: Serve, keep: bool
) -> None:
    """``server.keep_alive_streams`` (issue 21): off, a streamed answer says ``Connection: close``
    and the client's next request goes on a new connection, as llama-server's own does (a pooling
    client then holds no idle connection to scan); on, the connection is kept. A non-streamed
    answer keeps it either way."""
    async with serve({"m": {"preload": True}}, server={"keep_alive_streams": keep}) as gw:
        path, body = chat("openai", "m", stream=False)
        whole = await gw.client.post(path, json=body)
        assert whole.status_code == 200 and whole.headers.get("connection") != "close"
        ports = [_local_port(whole)]
        for _ in range(2):
            async with gw.client.stream("POST", path, json={**body, "stream": True}) as r:
                assert r.status_code == 200
                ports.append(_local_port(r))  # while it is open: a closed socket has no address
                text = b"".join([c async for c in r.aiter_raw()])
            assert b"data: [DONE]" in text
            assert (r.headers.get("connection") == "close") is not keep
        after = await gw.client.post(path, json=body)
        assert after.status_code == 200
        ports.append(_local_port(after))
    # non-streamed, stream, stream, non-streamed: kept -> one connection; closed -> a new one
    # after each stream (the first stream still reuses the non-streamed answer's connection)
    assert ports[1] == ports[0]
    if keep:
        assert len(set(ports)) == 1, ports
    else:
        assert ports[2] != ports[1] and ports[3] != ports[2], ports
