"""One request and one error shape per API dialect the gateway speaks, for the in-process tests."""

from __future__ import annotations

import json
from typing import Any, Literal

Dialect = Literal["openai", "anthropic", "ollama"]
DIALECTS: tuple[Dialect, ...] = ("openai", "anthropic", "ollama")

PATHS: dict[Dialect, str] = {
    "openai": "/v1/chat/completions",
    "anthropic": "/v1/messages",
    "ollama": "/api/chat",
}
HELLO = [{"role": "user", "content": "Hi"}]


def chat(dialect: Dialect, model: str, *, stream: bool) -> tuple[str, dict[str, Any]]:
    """(path, body) of a small chat request in ``dialect``."""
    body: dict[str, Any] = {"model": model, "messages": HELLO, "stream": stream}
    if dialect == "anthropic":
        body["max_tokens"] = 3
    return PATHS[dialect], body


def error_of(dialect: Dialect, body: Any) -> tuple[str, str | None]:
    """(message, type) of an error body, asserting the dialect's shape: OpenAI's
    ``{"error": {message, type, …}}``, Anthropic's ``{"type": "error", "error": {type, message}}``,
    Ollama's ``{"error": "message"}``."""
    if dialect == "anthropic":
        assert body["type"] == "error" and set(body["error"]) >= {"type", "message"}, body
        return body["error"]["message"], body["error"]["type"]
    if dialect == "ollama":
        assert isinstance(body["error"], str), body
        return body["error"], None
    assert isinstance(body["error"], dict) and "message" in body["error"], body
    return body["error"]["message"], body["error"]["type"]


def stream_error(dialect: Dialect, data: bytes) -> str:
    """The error message a broken stream ended with, in the dialect's form: an SSE ``data:`` event
    (OpenAI), an ``event: error`` (Anthropic), or a last NDJSON line with ``error`` (Ollama)."""
    if dialect == "ollama":
        last = json.loads(data.strip().rsplit(b"\n", 1)[-1])
        assert isinstance(last["error"], str), last
        return last["error"]
    event = data.strip().rsplit(b"\n\n", 1)[-1]
    if dialect == "anthropic":
        head, _, payload = event.partition(b"\n")
        assert head == b"event: error", event
        return error_of(dialect, json.loads(payload.removeprefix(b"data: ")))[0]
    assert event.startswith(b"data: {"), event
    return error_of(dialect, json.loads(event.removeprefix(b"data: ")))[0]
