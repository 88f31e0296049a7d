"""The FAKE peer (tests/support/fake_peer.py) tells the truth: each behaviour over plain httpx,
and the real ``openai`` and ``anthropic`` client libraries talking to it directly."""

from __future__ import annotations

import base64
import json
import socket
import struct
import time
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionToolParam

from tests.support.fake_peer import FakePeer

KEY = "peer-secret"
TIMEOUT = httpx.Timeout(5.0)
WEATHER_TOOL: ChatCompletionToolParam = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


@pytest.fixture
def openai_peer() -> Iterator[FakePeer]:
    with FakePeer(api="openai", models=["m1", "m2"], key=KEY) as peer:
        yield peer


@pytest.fixture
def anthropic_peer() -> Iterator[FakePeer]:
    with FakePeer(api="anthropic", models=["c1"], key=KEY) as peer:
        yield peer


def client(peer: FakePeer, **headers: str) -> httpx.Client:
    auth = {"authorization": f"Bearer {KEY}"} if peer.api == "openai" else {"x-api-key": KEY}
    return httpx.Client(base_url=peer.url, headers={**auth, **headers}, timeout=TIMEOUT)


def sse(text: str) -> list[tuple[str | None, str]]:
    """``(event name or None, data)`` of each event of an SSE body."""
    out = []
    for block in text.split("\n\n"):
        if not block.strip():
            continue
        name, data = None, []
        for line in block.split("\n"):
            if line.startswith("event: "):
                name = line[len("event: ") :]
            elif line.startswith("data: "):
                data.append(line[len("data: ") :])
        out.append((name, "\n".join(data)))
    return out


def stream_events(c: httpx.Client, path: str, body: dict[str, Any]) -> tuple[httpx.Response, list[Any]]:
    with c.stream("POST", path, json=body) as r:
        text = r.read().decode()
    return r, sse(text)


# --- OpenAI over httpx --------------------------------------------------------------------------


def test_models_list_and_headers_are_recorded(openai_peer: FakePeer) -> None:
    assert openai_peer.url.startswith("http://127.0.0.1:")
    with client(openai_peer, **{"X-Trace-Id": "abc"}) as c:
        r = c.get("/v1/models")
    assert r.status_code == 200
    assert r.json() == {
        "object": "list",
        "data": [
            {"id": "m1", "object": "model", "created": 0, "owned_by": "fake"},
            {"id": "m2", "object": "model", "created": 0, "owned_by": "fake"},
        ],
    }
    [rec] = openai_peer.requests
    assert (rec.method, rec.path, rec.body, rec.json) == ("GET", "/v1/models", b"", None)
    assert rec.headers["x-trace-id"] == "abc"
    assert rec.headers["authorization"] == f"Bearer {KEY}"
    assert all(name == name.lower() for name in rec.headers)


def test_chat_whole(openai_peer: FakePeer) -> None:
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": [{"type": "text", "text": "hello "}, {"type": "text", "text": "there"}]},
    ]
    with client(openai_peer) as c:
        r = c.post("/v1/chat/completions", json={"model": "m2", "messages": messages})
    assert r.status_code == 200
    assert r.headers["content-length"] == str(len(r.content))
    out = r.json()
    assert out["object"] == "chat.completion"
    assert out["model"] == "m2"
    [choice] = out["choices"]
    assert choice["message"] == {"role": "assistant", "content": "echo from m2: hello there"}
    assert choice["finish_reason"] == "stop"
    usage = out["usage"]
    assert usage["prompt_tokens"] > 0 and usage["completion_tokens"] > 0
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    rec = openai_peer.requests[-1]
    assert rec.json == {"model": "m2", "messages": messages}
    assert json.loads(rec.body) == rec.json


def test_chat_streamed(openai_peer: FakePeer) -> None:
    body = {"model": "m1", "messages": [{"role": "user", "content": "say something"}]}
    with client(openai_peer) as c:
        whole = c.post("/v1/chat/completions", json=body).json()
        r, events = stream_events(c, "/v1/chat/completions", {**body, "stream": True})
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    assert r.headers["connection"] == "close"
    assert events[-1] == (None, "[DONE]")
    chunks = [json.loads(data) for _, data in events[:-1]]
    assert all(ch["object"] == "chat.completion.chunk" for ch in chunks)
    pieces = [ch["choices"][0]["delta"].get("content") for ch in chunks]
    assert len([p for p in pieces if p]) >= 3
    assert "".join(p or "" for p in pieces) == whole["choices"][0]["message"]["content"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["usage"]["total_tokens"] == whole["usage"]["total_tokens"]
    assert all(ch["choices"][0]["finish_reason"] is None for ch in chunks[:-1])


def test_chat_tool_call_whole_and_streamed(openai_peer: FakePeer) -> None:
    body = {
        "model": "m1",
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "tools": [WEATHER_TOOL],
    }
    with client(openai_peer) as c:
        out = c.post("/v1/chat/completions", json=body).json()
        _, events = stream_events(c, "/v1/chat/completions", {**body, "stream": True})
    [choice] = out["choices"]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["tool_calls"] == [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
        }
    ]
    chunks = [json.loads(data) for _, data in events[:-1]]
    calls = [c for ch in chunks for c in ch["choices"][0]["delta"].get("tool_calls") or []]
    assert calls[0]["id"] == "call_1" and calls[0]["function"]["name"] == "get_weather"
    assert all(c["index"] == 0 for c in calls)
    assert "".join(c["function"]["arguments"] for c in calls) == '{"city": "Paris"}'
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    assert "usage" in chunks[-1]
    # Without tools, or without "weather", the same request is answered with text.
    with client(openai_peer) as c:
        plain = c.post("/v1/chat/completions", json={**body, "tools": []}).json()
    assert plain["choices"][0]["finish_reason"] == "stop"


def test_completions_whole_and_streamed(openai_peer: FakePeer) -> None:
    body = {"model": "m1", "prompt": "once upon a time"}
    with client(openai_peer) as c:
        out = c.post("/v1/completions", json=body).json()
        _, events = stream_events(c, "/v1/completions", {**body, "stream": True})
    assert out["object"] == "text_completion"
    assert out["choices"][0]["text"] == "echo from m1: once upon a time"
    assert out["choices"][0]["finish_reason"] == "stop"
    assert out["usage"]["total_tokens"] > 0
    assert events[-1] == (None, "[DONE]")
    chunks = [json.loads(data) for _, data in events[:-1]]
    assert len(chunks) >= 4
    assert "".join(ch["choices"][0]["text"] for ch in chunks) == out["choices"][0]["text"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop" and "usage" in chunks[-1]


def test_embeddings(openai_peer: FakePeer) -> None:
    with client(openai_peer) as c:
        one = c.post("/v1/embeddings", json={"model": "m1", "input": "a"}).json()
        two = c.post("/v1/embeddings", json={"model": "m1", "input": ["a", "b"]}).json()
        b64 = c.post("/v1/embeddings", json={"model": "m1", "input": "a", "encoding_format": "base64"}).json()
    [vec] = [d["embedding"] for d in one["data"]]
    assert len(vec) == 8 and all(isinstance(x, float) for x in vec)
    assert [d["index"] for d in two["data"]] == [0, 1]
    assert two["data"][0]["embedding"] == vec != two["data"][1]["embedding"]
    decoded = struct.unpack("<8f", base64.b64decode(b64["data"][0]["embedding"]))
    assert decoded == pytest.approx(vec, abs=1e-6)
    assert one["usage"]["prompt_tokens"] > 0


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/v1/embeddings"])
def test_unknown_model_is_404_in_openai_shape(openai_peer: FakePeer, path: str) -> None:
    body = {"model": "nope", "messages": [], "prompt": "x", "input": "x"}
    with client(openai_peer) as c:
        r = c.post(path, json=body)
    assert r.status_code == 404
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == "model_not_found"
    assert "nope" in error["message"]


def test_openai_peer_has_no_anthropic_routes(openai_peer: FakePeer) -> None:
    with client(openai_peer) as c:
        r = c.post("/v1/messages", json={"model": "m1", "max_tokens": 5, "messages": []})
    assert r.status_code == 404
    assert r.json()["error"]["type"] == "invalid_request_error"


# --- Anthropic over httpx -----------------------------------------------------------------------


def test_anthropic_models_and_message_whole(anthropic_peer: FakePeer) -> None:
    body = {"model": "c1", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
    with client(anthropic_peer) as c:
        models = c.get("/v1/models").json()
        r = c.post("/v1/messages", json=body)
    assert models["has_more"] is False
    assert [(m["id"], m["type"], m["display_name"]) for m in models["data"]] == [("c1", "model", "c1")]
    assert r.status_code == 200
    out = r.json()
    assert {k: out[k] for k in ("type", "role", "model", "content", "stop_reason")} == {
        "type": "message",
        "role": "assistant",
        "model": "c1",
        "content": [{"type": "text", "text": "echo from c1: hi"}],
        "stop_reason": "end_turn",
    }
    assert out["id"] and out["usage"]["input_tokens"] > 0 and out["usage"]["output_tokens"] > 0


def test_anthropic_message_streamed(anthropic_peer: FakePeer) -> None:
    body = {
        "model": "c1",
        "max_tokens": 16,
        "stream": True,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "tell me a story"}]}],
    }
    with client(anthropic_peer) as c:
        r, events = stream_events(c, "/v1/messages", body)
    assert r.headers["content-type"].startswith("text/event-stream")
    names = [name for name, _ in events]
    assert names[:2] == ["message_start", "content_block_start"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    deltas = names[2:-3]
    assert len(deltas) >= 3 and set(deltas) == {"content_block_delta"}
    datas = [json.loads(data) for _, data in events]
    assert [d["type"] for d in datas] == names
    text = "".join(d["delta"]["text"] for d in datas if d["type"] == "content_block_delta")
    assert text == "echo from c1: tell me a story"
    message_delta = datas[-2]
    assert message_delta["delta"]["stop_reason"] == "end_turn"
    assert message_delta["usage"]["output_tokens"] > 0


@pytest.mark.parametrize(
    ("method", "path"),
    [("POST", "/v1/chat/completions"), ("POST", "/v1/completions"), ("POST", "/v1/embeddings")],
)
def test_anthropic_peer_has_no_openai_routes(anthropic_peer: FakePeer, method: str, path: str) -> None:
    with client(anthropic_peer) as c:
        r = c.request(method, path, json={"model": "c1", "messages": [], "prompt": "x", "input": "x"})
    assert r.status_code == 404
    assert r.json() == {
        "type": "error",
        "error": {"type": "not_found_error", "message": r.json()["error"]["message"]},
    }


def test_anthropic_unknown_model_is_404(anthropic_peer: FakePeer) -> None:
    with client(anthropic_peer) as c:
        r = c.post("/v1/messages", json={"model": "nope", "max_tokens": 5, "messages": []})
    assert r.status_code == 404
    assert r.json()["error"]["type"] == "not_found_error"


# --- the key ------------------------------------------------------------------------------------


def test_openai_key_is_checked_and_recorded(openai_peer: FakePeer) -> None:
    with httpx.Client(base_url=openai_peer.url, timeout=TIMEOUT) as c:
        missing = c.get("/v1/models")
        wrong = c.get("/v1/models", headers={"authorization": "Bearer other"})
        as_x_api_key = c.get("/v1/models", headers={"x-api-key": KEY})
        right = c.get("/v1/models", headers={"authorization": f"Bearer {KEY}"})
    for r in (missing, wrong, as_x_api_key):
        assert r.status_code == 401
        assert r.json()["error"]["code"] == "invalid_api_key"
        assert r.json()["error"]["type"] == "invalid_request_error"
    assert right.status_code == 200
    assert len(openai_peer.requests) == 4
    assert openai_peer.requests[1].headers["authorization"] == "Bearer other"


def test_anthropic_key_is_checked_and_recorded(anthropic_peer: FakePeer) -> None:
    body = {"model": "c1", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
    with httpx.Client(base_url=anthropic_peer.url, timeout=TIMEOUT) as c:
        missing = c.post("/v1/messages", json=body)
        wrong = c.post("/v1/messages", json=body, headers={"x-api-key": "other"})
        right = c.post("/v1/messages", json=body, headers={"x-api-key": KEY})
        bearer = c.post("/v1/messages", json=body, headers={"authorization": f"Bearer {KEY}"})
    for r in (missing, wrong):
        assert r.status_code == 401
        assert r.json() == {
            "type": "error",
            "error": {"type": "authentication_error", "message": "invalid x-api-key"},
        }
    assert right.status_code == 200 and bearer.status_code == 200
    assert [rec.headers.get("x-api-key") for rec in anthropic_peer.requests] == [None, "other", KEY, None]


def test_no_key_means_no_check() -> None:
    with FakePeer(api="openai", models=["m1"]) as peer, httpx.Client(timeout=TIMEOUT) as c:
        assert c.get(peer.url + "/v1/models").status_code == 200


# --- modes --------------------------------------------------------------------------------------


def test_hang_reads_the_request_and_never_answers(openai_peer: FakePeer) -> None:
    openai_peer.mode = "hang"
    body = {"model": "m1", "messages": [{"role": "user", "content": "hi"}]}
    with client(openai_peer) as c, pytest.raises(httpx.ReadTimeout):
        c.post("/v1/chat/completions", json=body, timeout=httpx.Timeout(5.0, read=0.5))
    assert openai_peer.requests[-1].json == body
    # Settable at any time: the next request is answered.
    openai_peer.mode = "ok"
    with client(openai_peer) as c:
        assert c.get("/v1/models").status_code == 200


def test_close_releases_a_hung_request_promptly() -> None:
    peer = FakePeer(api="anthropic", models=["c1"], mode="hang").start()
    port = peer.port
    # A raw client waits on the hung answer while the peer closes.
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
        deadline = time.monotonic() + 5
        while not peer.requests and time.monotonic() < deadline:
            time.sleep(0.01)
        assert peer.requests[0].path == "/v1/models"
        started = time.monotonic()
        peer.close()
        assert time.monotonic() - started < 2.0
        assert s.recv(100) == b""  # closed, without an answer
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()


@pytest.mark.parametrize(("api", "shape"), [("openai", "error"), ("anthropic", "type")])
def test_error500(api: Any, shape: str) -> None:
    with FakePeer(api=api, models=["m"], key=KEY, mode="error500") as peer, client(peer) as c:
        r = c.get("/v1/models")
        assert r.status_code == 500
        assert shape in r.json()
        assert "error" in r.json()
        assert len(peer.requests) == 1


def test_drop_closes_without_an_answer(openai_peer: FakePeer) -> None:
    openai_peer.mode = "drop"
    with client(openai_peer) as c, pytest.raises(httpx.RemoteProtocolError):
        c.post("/v1/completions", json={"model": "m1", "prompt": "x"})
    assert openai_peer.requests[-1].json == {"model": "m1", "prompt": "x"}


def test_first_byte_delay(openai_peer: FakePeer) -> None:
    openai_peer.first_byte_delay = 0.3
    with client(openai_peer) as c:
        started = time.monotonic()
        r = c.get("/v1/models")
        assert time.monotonic() - started >= 0.3
        assert r.status_code == 200
        with pytest.raises(httpx.ReadTimeout):
            c.get("/v1/models", timeout=httpx.Timeout(5.0, read=0.1))


def test_bad_mode_is_refused(openai_peer: FakePeer) -> None:
    with pytest.raises(ValueError, match="mode"):
        openai_peer.mode = "sideways"  # type: ignore[assignment]


# --- the real client libraries ------------------------------------------------------------------


def sdk_openai(peer: FakePeer) -> openai.OpenAI:
    return openai.OpenAI(base_url=peer.url + "/v1", api_key=KEY, max_retries=0, timeout=5.0)


def sdk_anthropic(peer: FakePeer) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=peer.url, api_key=KEY, max_retries=0, timeout=5.0)


def test_openai_sdk_chat_whole_and_streamed(openai_peer: FakePeer) -> None:
    with sdk_openai(openai_peer) as sdk:
        assert [m.id for m in sdk.models.list()] == ["m1", "m2"]
        out = sdk.chat.completions.create(model="m1", messages=[{"role": "user", "content": "hello"}])
        assert out.choices[0].message.content == "echo from m1: hello"
        assert out.choices[0].finish_reason == "stop"
        assert out.usage is not None and out.usage.total_tokens > 0
        stream = sdk.chat.completions.create(
            model="m1", messages=[{"role": "user", "content": "hello"}], stream=True
        )
        chunks = list(stream)
        text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        assert text == "echo from m1: hello"
        assert chunks[-1].choices[0].finish_reason == "stop"
        assert chunks[-1].usage is not None
        embedded = sdk.embeddings.create(model="m2", input=["a", "b"])  # base64 by default
        assert [len(e.embedding) for e in embedded.data] == [8, 8]
    assert openai_peer.requests[1].headers["authorization"] == f"Bearer {KEY}"


def test_openai_sdk_streamed_tool_call(openai_peer: FakePeer) -> None:
    with sdk_openai(openai_peer) as sdk:
        stream = sdk.chat.completions.create(
            model="m2",
            messages=[{"role": "user", "content": "weather in Paris please"}],
            tools=[WEATHER_TOOL],
            stream=True,
        )
        name, arguments, finish = "", "", None
        for ch in stream:
            for call in ch.choices[0].delta.tool_calls or []:
                assert call.index == 0
                name += (call.function and call.function.name) or ""
                arguments += (call.function and call.function.arguments) or ""
            finish = ch.choices[0].finish_reason or finish
    assert (name, json.loads(arguments), finish) == ("get_weather", {"city": "Paris"}, "tool_calls")


def test_openai_sdk_errors(openai_peer: FakePeer) -> None:
    with sdk_openai(openai_peer) as sdk, pytest.raises(openai.NotFoundError) as e:
        sdk.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    assert e.value.code == "model_not_found"
    with (
        openai.OpenAI(base_url=openai_peer.url + "/v1", api_key="bad", max_retries=0, timeout=5.0) as sdk,
        pytest.raises(openai.AuthenticationError),
    ):
        sdk.models.list()


def test_anthropic_sdk_messages_whole_and_streamed(anthropic_peer: FakePeer) -> None:
    with sdk_anthropic(anthropic_peer) as sdk:
        assert [m.id for m in sdk.models.list()] == ["c1"]
        out = sdk.messages.create(model="c1", max_tokens=32, messages=[{"role": "user", "content": "hello"}])
        assert out.content[0].type == "text" and out.content[0].text == "echo from c1: hello"
        assert out.stop_reason == "end_turn" and out.usage.output_tokens > 0
        with sdk.messages.stream(
            model="c1", max_tokens=32, messages=[{"role": "user", "content": "hello"}]
        ) as stream:
            pieces = list(stream.text_stream)
            final = stream.get_final_message()
        assert len(pieces) >= 3 and "".join(pieces) == "echo from c1: hello"
        assert final.stop_reason == "end_turn" and final.usage.output_tokens > 0
        with sdk.messages.stream(
            model="c1",
            max_tokens=32,
            messages=[{"role": "user", "content": "what's the weather?"}],
            tools=[{"name": "get_weather", "input_schema": {"type": "object"}}],
        ) as stream:
            used = stream.get_final_message()
        assert used.stop_reason == "tool_use"
        block = used.content[0]
        assert block.type == "tool_use" and block.name == "get_weather" and block.input == {"city": "Paris"}


def test_anthropic_sdk_errors(anthropic_peer: FakePeer) -> None:
    with sdk_anthropic(anthropic_peer) as sdk, pytest.raises(anthropic.NotFoundError):
        sdk.messages.create(model="nope", max_tokens=5, messages=[{"role": "user", "content": "x"}])
    with (
        anthropic.Anthropic(base_url=anthropic_peer.url, api_key="bad", max_retries=0, timeout=5.0) as sdk,
        pytest.raises(anthropic.AuthenticationError),
    ):
        sdk.models.list()
