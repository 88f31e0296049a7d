"""A client that leaves a whole (non-streamed) request, in-process against the fake llama-server:
the request is cancelled at once in every dialect — its slot comes back long before the child
would have answered, no task is left — and its activity row says it was cancelled, with 499
(nothing was sent). The real llama-server stopping its task is tests/gateway/test_client_gone.py."""

from __future__ import annotations

import logging
from typing import Any

import anyio
import httpx
import pytest

from tests.gateway_fast.conftest import Serve
from tests.support.gateway import Gateway, poll, tasks

pytestmark = pytest.mark.anyio

HELLO = [{"role": "user", "content": "Hi"}]
#: (route, body) of a whole request, per dialect and route.
WHOLE: dict[str, tuple[str, dict[str, Any]]] = {
    "openai": ("/v1/chat/completions", {"messages": HELLO}),
    "anthropic": ("/v1/messages", {"messages": HELLO, "max_tokens": 3}),
    "ollama-chat": ("/api/chat", {"messages": HELLO, "stream": False}),
    "ollama-generate": ("/api/generate", {"prompt": "Hi", "stream": False}),
}


async def _leave(gw: Gateway, path: str, body: dict[str, Any], rid: str) -> None:
    """Send the request and give up on it after a short read timeout (the connection closes)."""
    timeout = httpx.Timeout(10, read=0.3)
    async with httpx.AsyncClient(base_url=gw.url, timeout=timeout) as c:
        with pytest.raises(httpx.ReadTimeout):
            await c.post(path, json=body, headers={"X-Request-ID": rid})


async def _row(gw: Gateway, rid: str) -> dict[str, Any]:
    """The activity row of request ``rid``, once written (bounded)."""
    with anyio.fail_after(5):
        while True:
            rows = (await gw.client.get("/api/activity", params={"limit": 50})).json()["activity"]
            found: dict[str, Any] | None = next((r for r in rows if r["request_id"] == rid), None)
            if found is not None:
                return found
            await anyio.sleep(0.02)


@pytest.mark.parametrize("case", list(WHOLE))
async def test_a_client_that_leaves_a_whole_request_cancels_it_and_frees_the_slot(
    serve: Serve, case: str
) -> None:
    """One slot, an answer 30 s away; the client gives up after 0.3 s: the slot is back at once
    (the next request queues instead of a 429), and the row is cancelled with status 499."""
    models = {
        "m": {"preload": True, "max_concurrency": 1, "queue": 0, "args": ["--fake-first-token-delay", "30"]}
    }
    async with serve(models) as gw:
        m = gw.model("m")
        path, body = WHOLE[case]
        before = tasks()
        await _leave(gw, path, {"model": "m", **body}, f"gone-{case}")
        await poll(lambda: m.in_flight == 0, timeout=5, what="the slot back after the client left")
        await poll(lambda: not (tasks() - before), what="the request's tasks to end")
        row = await _row(gw, f"gone-{case}")
        assert row["cancelled"] and row["status"] == 499 and row["error"] == "client_gone", row
        assert row["model"] == "m" and not row["stream"], row
        metrics = (await gw.client.get("/metrics")).text.splitlines()
        counted = [x for x in metrics if x.startswith("forge_requests_total{") and f'"{path}"' in x]
        assert any('status="499"' in x and x.endswith(" 1.0") for x in counted), counted


#: (route, body, the end marker the client reads before it closes) of a streamed request, per
#: dialect: each official client closes its connection as soon as it has read its stream's end.
STREAMED: dict[str, tuple[str, dict[str, Any], bytes]] = {
    "openai": ("/v1/chat/completions", {"messages": HELLO, "stream": True}, b"[DONE]"),
    "openai-completions": ("/v1/completions", {"prompt": "Hi", "stream": True}, b"[DONE]"),
    "anthropic": ("/v1/messages", {"messages": HELLO, "max_tokens": 3, "stream": True}, b"message_stop"),
    "ollama-chat": ("/api/chat", {"messages": HELLO}, b'"done":true'),
    "ollama-generate": ("/api/generate", {"prompt": "Hi"}, b'"done":true'),
}


@pytest.mark.parametrize("case", list(STREAMED))
async def test_a_client_that_closes_once_it_read_the_end_had_its_whole_answer(
    serve: Serve, case: str
) -> None:
    """The child holds its response open after the stream's last event (the gap between
    ``[DONE]`` and the end of the body, which a busy machine widens); the client closes right
    after reading its end marker, as the OpenAI SDK does. The row says a complete answer (not
    cancelled, 200), and the slot and the request's tasks are freed at once."""
    models = {"m": {"preload": True, "max_concurrency": 1, "args": ["--fake-linger-after-end", "30"]}}
    async with serve(models) as gw:
        m = gw.model("m")
        path, body, end = STREAMED[case]
        before = tasks()
        seen = b""
        with anyio.fail_after(10):
            async with (
                httpx.AsyncClient(base_url=gw.url, timeout=10) as c,
                c.stream(
                    "POST", path, json={"model": "m", **body}, headers={"X-Request-ID": f"end-{case}"}
                ) as r,
            ):
                assert r.status_code == 200
                async for chunk in r.aiter_raw():
                    seen += chunk
                    if end in seen.replace(b" ", b""):
                        break
            assert end in seen.replace(b" ", b""), seen
            await poll(lambda: m.in_flight == 0, timeout=5, what="the slot back after the client left")
            await poll(lambda: not (tasks() - before), what="the request's tasks to end")
        row = await _row(gw, f"end-{case}")
        assert not row["cancelled"] and row["status"] == 200 and row["stream"], row
        assert row["error"] is None and row["model"] == "m", row


#: A model route of each way a body is read: the ingress's JSON, Ollama's, an upload's form.
HALF_SENT = ("/v1/chat/completions", "/api/chat", "/v1/audio/transcriptions")


@pytest.mark.parametrize("path", HALF_SENT)
async def test_a_client_that_leaves_while_sending_its_body_is_not_an_internal_error(
    serve: Serve, path: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The body is declared 1000 bytes long, 10 are sent, and the connection closes: no 500, no
    traceback or error in the log; the activity row says the client left (499)."""
    caplog.set_level(logging.INFO, logger="rocmforge")
    async with serve({"m": {"preload": True}}) as gw:
        host, port = gw.url.removeprefix("http://").split(":")
        head = (
            f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"X-Request-ID: half-{path.replace('/', '-')}\r\nContent-Length: 1000\r\n\r\n"
        )
        with anyio.fail_after(10):
            stream = await anyio.connect_tcp(host, int(port))
            await stream.send(head.encode() + b'{"model":')
            await stream.aclose()
        row = await _row(gw, f"half-{path.replace('/', '-')}")
        assert row["status"] == 499 and row["error"] == "client_gone", row
        assert (await gw.client.get("/v1/models")).status_code == 200
    bad = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]
    assert not bad, bad
