"""The one relay response, in-process and in milliseconds: its keep-alive, its one load wait and the
one place where it renders errors. The opener here stands in for the upstream (a model that loads,
queues or answers on the test's cue); the real-process tests in tests/gateway/test_loading.py
are the proof that the real path does the same."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable

import anyio
import anyio.lowlevel
import pytest
from starlette.types import Message

from rocmforge_supervisor._errors import ModelLoading, QueueFull, ServerUnavailable
from rocmforge_supervisor.service.proxy._relay import KEEPALIVE, Opened, RelayResponse

pytestmark = pytest.mark.anyio

INTERVAL = 0.02
SCOPE = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": []}


class Client:
    """The ASGI server's side: what was sent, and a receive that says 'disconnected' on cue."""

    def __init__(self) -> None:
        self.sent: list[Message] = []
        self.changed = anyio.Event()
        self.gone = anyio.Event()

    async def receive(self) -> Message:
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: Message) -> None:
        self.sent.append(message)
        self.changed.set()
        self.changed = anyio.Event()

    async def until(self, what: Callable[[], bool], timeout: float = 5.0) -> None:
        with anyio.fail_after(timeout):
            while not what():
                await self.changed.wait()

    @property
    def status(self) -> int:
        return int(self.sent[0]["status"])

    @property
    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.sent if m["type"] == "http.response.body")

    def pings(self) -> int:
        return self.body.count(KEEPALIVE)


async def _chunks(*chunks: bytes) -> AsyncIterator[bytes]:
    for c in chunks:
        yield c


def _stream(*chunks: bytes) -> Opened:
    return Opened(200, {"content-type": "text/event-stream"}, chunks=_chunks(*chunks))


async def test_a_stream_that_waits_for_a_slot_gets_keep_alive_comments_then_its_events() -> None:
    client, answer = Client(), anyio.Event()

    async def opener(loaded: Callable[[], None]) -> Opened:
        loaded()  # the model is ready: the wait for a slot (or the first token) begins
        await answer.wait()
        return _stream(b'data: {"x":1}\n\n', b"data: [DONE]\n\n")

    relay = RelayResponse(opener, dialect="openai", request_id="r1", stream=True, interval=INTERVAL)
    async with anyio.create_task_group() as tg:
        tg.start_soon(relay, SCOPE, client.receive, client.send)
        await client.until(lambda: client.pings() >= 2)
        answer.set()
    assert client.status == 200 and (b"x-request-id", b"r1") in client.sent[0]["headers"]
    events = client.body.replace(KEEPALIVE, b"")
    assert events == b'data: {"x":1}\n\ndata: [DONE]\n\n' and client.body.startswith(KEEPALIVE)
    assert client.sent[-1] == {"type": "http.response.body", "body": b"", "more_body": False}


async def test_the_load_wait_is_not_kept_alive_and_ends_in_a_real_503() -> None:
    """Waited for once, inside the opener, before ``loaded``: no comment commits the response, so
    the 503 goes out with its status, Retry-After and progress (the client's cue to come back)."""
    client = Client()

    async def opener(loaded: Callable[[], None]) -> Opened:
        await anyio.sleep(INTERVAL * 5)  # the model loads for five intervals, then load_wait ends
        raise ModelLoading("still loading", retry_after=3.0, loading={"state": "loading", "progress": 0.5})

    await RelayResponse(opener, dialect="openai", request_id=None, stream=True, interval=INTERVAL)(
        SCOPE, client.receive, client.send
    )
    assert client.status == 503 and client.pings() == 0
    assert (b"retry-after", b"3") in client.sent[0]["headers"]
    assert json.loads(client.body)["loading"]["progress"] == 0.5


async def test_a_quick_error_keeps_its_status_in_the_routes_dialect() -> None:
    client = Client()

    async def opener(loaded: Callable[[], None]) -> Opened:
        loaded()
        raise QueueFull("model 'm' has 4 requests waiting", retry_after=1.0)

    await RelayResponse(opener, dialect="anthropic", request_id=None, stream=True, interval=INTERVAL)(
        SCOPE, client.receive, client.send
    )
    body = json.loads(client.body)
    assert client.status == 429 and body["type"] == "error" and body["error"]["type"] == "rate_limit_error"


async def test_an_error_after_the_commit_is_one_sse_error_event_in_the_dialect() -> None:
    client, fail = Client(), anyio.Event()

    async def opener(loaded: Callable[[], None]) -> Opened:
        loaded()
        await fail.wait()
        raise ServerUnavailable("model 'm' went away while answering")

    relay = RelayResponse(opener, dialect="anthropic", request_id=None, stream=True, interval=INTERVAL)
    async with anyio.create_task_group() as tg:
        tg.start_soon(relay, SCOPE, client.receive, client.send)
        await client.until(lambda: client.pings() >= 1)
        fail.set()
    assert client.status == 200
    event = client.body.replace(KEEPALIVE, b"")
    assert event.startswith(b"event: error\ndata: ") and b"went away" in event
    assert client.sent[-1]["more_body"] is False


async def test_a_client_that_leaves_cancels_the_stream_and_its_upstream_is_released() -> None:
    client, closed = Client(), anyio.Event()

    async def endless() -> AsyncIterator[bytes]:
        while True:
            yield b'data: {"x":1}\n\n'
            await anyio.lowlevel.checkpoint()

    async def close() -> None:
        closed.set()

    async def opener(loaded: Callable[[], None]) -> Opened:
        return Opened(200, {"content-type": "text/event-stream"}, chunks=endless(), close=close)

    relay = RelayResponse(opener, dialect="openai", request_id=None, stream=True, interval=INTERVAL)
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(relay, SCOPE, client.receive, client.send)
            await client.until(lambda: len(client.sent) > 3)
            client.gone.set()
        await closed.wait()
    assert client.pings() == 0  # the first event came at once: no comment before it


async def test_a_whole_answer_goes_out_with_its_own_status_and_length() -> None:
    client = Client()

    async def opener(loaded: Callable[[], None]) -> Opened:
        return Opened(200, {"Content-Type": "application/json"}, b'{"ok":true}')

    await RelayResponse(opener, dialect="openai", request_id="r2", stream=False, interval=INTERVAL)(
        SCOPE, client.receive, client.send
    )
    headers = dict(client.sent[0]["headers"])
    assert client.status == 200 and client.body == b'{"ok":true}'
    assert headers[b"content-length"] == b"11" and headers[b"content-type"] == b"application/json"
