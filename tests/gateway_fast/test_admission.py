"""Whether and when a request gets a slot, in-process against the fake llama-server: a full
queue (429 + Retry-After), a load that outlasts ``load_wait`` (503 + Retry-After + progress), a
request that waits for a cold load and is served, and a model whose load fails: 503 while restarts
are left, then a 500 with ``X-Should-Retry: false`` once it failed for good (``ModelFailed``)."""

from __future__ import annotations

import pytest

from rocmforge_supervisor.supervisor import ModelState
from tests.gateway_fast.conftest import Serve
from tests.gateway_fast.dialects import DIALECTS, Dialect, chat, error_of
from tests.support.gateway import poll
from tests.support.supervised import wait_state

pytestmark = pytest.mark.anyio

_429_TYPES = {"openai": "rate_limit_error", "anthropic": "rate_limit_error", "ollama": None}
_503_TYPES = {"openai": "unavailable_error", "anthropic": "overloaded_error", "ollama": None}
_500_TYPES = {"openai": "server_error", "anthropic": "api_error", "ollama": None}


async def test_a_full_queue_is_a_429_with_retry_after_in_each_dialect(serve: Serve) -> None:
    slow = ["--fake-chunks", "500", "--fake-token-delay", "0.02"]
    models = {"m": {"preload": True, "max_concurrency": 1, "queue": 0, "args": slow}}
    async with serve(models) as gw:
        path, body = chat("openai", "m", stream=True)
        async with gw.client.stream("POST", path, json=body) as held:
            assert held.status_code == 200
            await poll(lambda: gw.model("m").in_flight == 1, what="the held request")
            for dialect in DIALECTS:
                path, other = chat(dialect, "m", stream=False)
                r = await gw.client.post(path, json=other)
                assert r.status_code == 429, r.text
                assert int(r.headers["Retry-After"]) >= 1
                message, kind = error_of(dialect, r.json())
                assert kind == _429_TYPES[dialect]
                assert "max_concurrency = 1, queue = 0" in message, message
        await poll(lambda: gw.model("m").in_flight == 0, what="the slot back once the held one left")
        r = await gw.client.post("/v1/chat/completions", json={**body, "stream": False})
        assert r.status_code == 200, r.text


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_a_load_longer_than_load_wait_is_a_503_with_retry_after_and_progress(
    serve: Serve, dialect: Dialect
) -> None:
    models = {"m": {"args": ["--fake-load-seconds", "30"]}}
    async with serve(models, server={"load_wait": 0.2}) as gw:
        path, body = chat(dialect, "m", stream=dialect != "ollama")
        r = await gw.client.post(path, json=body)
        assert r.status_code == 503, r.text
        assert int(r.headers["Retry-After"]) >= 1
        message, kind = error_of(dialect, r.json())
        assert kind == _503_TYPES[dialect] and "still loading" in message
        assert r.json()["loading"]["state"] == "loading"
        assert gw.model("m").state == ModelState.LOADING  # the load goes on without its client


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("dialect", DIALECTS)
async def test_a_request_that_waits_for_a_cold_load_is_served(
    serve: Serve, dialect: Dialect, stream: bool
) -> None:
    models = {"m": {"args": ["--fake-load-seconds", "0.3"]}}
    async with serve(models, server={"sse_keepalive": 0.1}) as gw:
        assert gw.model("m").state == ModelState.UNLOADED
        path, body = chat(dialect, "m", stream=stream)
        r = await gw.client.post(path, json=body)
        assert r.status_code == 200, r.text
        assert b"tok" in r.content
        assert gw.model("m").state == ModelState.READY


async def test_a_load_that_keeps_failing_is_a_503_then_a_500_that_says_do_not_retry(serve: Serve) -> None:
    """``--fake-refuse``: the child says llama.cpp's "failed to load model" after half a second and
    exits. While the crash-loop breaker has tries left the wait ends in a 503 (retry later); once
    it opens, the model failed for good: 500 + ``X-Should-Retry: false`` (the SDKs obey it)."""
    models = {"m": {"args": ["--fake-refuse", "--fake-load-seconds", "0.5"]}}
    async with serve(models, server={"load_wait": 0.1}, crash_loop_max=2) as gw:
        path, body = chat("openai", "m", stream=False)
        r = await gw.client.post(path, json=body)
        assert r.status_code == 503 and r.json()["error"]["code"] == "model_loading", r.text
        assert "X-Should-Retry" not in r.headers
        await wait_state(gw.model("m"), ModelState.FAILED, timeout=10)
        for dialect in DIALECTS:
            path, body = chat(dialect, "m", stream=dialect == "anthropic")
            r = await gw.client.post(path, json=body)
            assert r.status_code == 500, r.text
            assert r.headers["X-Should-Retry"] == "false"
            message, kind = error_of(dialect, r.json())
            assert kind == _500_TYPES[dialect] and "model 'm' failed" in message and "forge load m" in message
