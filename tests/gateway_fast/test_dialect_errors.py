"""Every failure a chat request can meet, answered in the dialect of the route it came by —
OpenAI ``/v1/chat/completions``, Anthropic ``/v1/messages``, Ollama ``/api/chat`` — in-process,
against the fake llama-server (its faults are the knobs each model's ``args`` set)."""

from __future__ import annotations

import pytest

from rocmforge_supervisor.supervisor import ModelState
from tests.gateway_fast.conftest import Serve
from tests.gateway_fast.dialects import DIALECTS, Dialect, chat, error_of, stream_error
from tests.support.gateway import poll

pytestmark = pytest.mark.anyio

_404_TYPES = {"openai": "invalid_request_error", "anthropic": "not_found_error", "ollama": None}
_400_TYPES = {"openai": "invalid_request_error", "anthropic": "invalid_request_error", "ollama": None}
_500_TYPES = {"openai": "server_error", "anthropic": "api_error", "ollama": None}


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("dialect", DIALECTS)
async def test_an_upstream_500_is_a_500_in_the_dialect(serve: Serve, dialect: Dialect, stream: bool) -> None:
    """llama-server's own 500 (its error body) keeps its status, streamed or not: a stream whose
    first result is an error is answered before any byte of it (keep-alive on: the default)."""
    async with serve({"m": {"preload": True, "args": ["--fake-error", "500"]}}) as gw:
        path, body = chat(dialect, "m", stream=stream)
        r = await gw.client.post(path, json=body)
        assert r.status_code == 500, r.text
        message, kind = error_of(dialect, r.json())
        assert kind == _500_TYPES[dialect]
        assert "model 'm' failed: fake failure (500 on command)" in message


@pytest.mark.parametrize(
    ("dialect", "keepalive"), [("openai", 5.0), ("openai", 0), ("anthropic", 5.0), ("ollama", 5.0)]
)
async def test_a_child_that_dies_mid_stream_ends_the_stream_with_an_error_in_the_dialect(
    serve: Serve, dialect: Dialect, keepalive: float
) -> None:
    """The 200 has gone out: the error can only be the stream's last event, never its end marker."""
    models = {"m": {"preload": True, "args": ["--fake-die-mid-stream", "2", "--fake-token-delay", "0.01"]}}
    async with serve(models, server={"sse_keepalive": keepalive}) as gw:
        path, body = chat(dialect, "m", stream=True)
        r = await gw.client.post(path, json=body)
        assert r.status_code == 200
        assert b"tok0" in r.content or b"message_start" in r.content  # what came before the death
        assert b"[DONE]" not in r.content and b"message_stop" not in r.content
        assert "model 'm' stopped mid-stream" in stream_error(dialect, r.content)
        assert "dying mid-stream on command" in gw.child_log("m")
        # And it is replaced (waited for here, too: a stop that lands on the replacement's spawn
        # leaves asyncio a child it cannot reap, a ResourceWarning in whichever test comes next).
        await poll(lambda: (s := gw.model("m").status()).restarts >= 1 and s.state == ModelState.READY)


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_an_unknown_model_is_a_404_in_the_dialect(serve: Serve, dialect: Dialect) -> None:
    async with serve({"m": {}}) as gw:
        path, body = chat(dialect, "nosuch", stream=False)
        r = await gw.client.post(path, json=body)
        assert r.status_code == 404, r.text
        message, kind = error_of(dialect, r.json())
        assert kind == _404_TYPES[dialect] and "nosuch" in message


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_a_body_that_is_not_json_is_a_400_in_the_dialect(serve: Serve, dialect: Dialect) -> None:
    async with serve({"m": {}}) as gw:
        path, _ = chat(dialect, "m", stream=False)
        r = await gw.client.post(
            path, content=b'{"model": "m", ', headers={"Content-Type": "application/json"}
        )
        assert r.status_code == 400, r.text
        message, kind = error_of(dialect, r.json())
        assert kind == _400_TYPES[dialect] and "JSON" in message
        assert gw.model("m").state == ModelState.UNLOADED  # refused before a load was asked for
