"""OpenAI chat ⇄ Anthropic's Messages API, for an upstream that speaks only Anthropic's Messages API.

The reverse of :mod:`._anthropic`. That module serves Anthropic's clients from a server that
speaks only OpenAI chat; this one serves OpenAI's clients (``/v1/chat/completions``) from an
upstream that answers ``/v1/messages`` and nothing else (api.anthropic.com, or a proxy of it): no
OpenAI route to pass the request through to, so it is translated both ways.
:func:`messages_body` makes the Anthropic request from the OpenAI one (already checked at the
ingress in OpenAI's terms), and :class:`ChatAnswer` (a :class:`~..core._dialect.Translator`) turns
the upstream's answer, whole or streamed, into OpenAI's. The request half is :mod:`._to_messages`.

Answer: text blocks → ``message.content`` (joined), thinking → ``reasoning_content`` (as
llama-server writes it), ``tool_use`` → ``tool_calls`` (``input`` as a JSON string);
``stop_reason`` end_turn / stop_sequence / pause_turn → ``stop``, max_tokens → ``length``,
tool_use → ``tool_calls``, refusal → ``content_filter``; ``usage``: the prompt is
``input_tokens`` plus the cache's reads and writes (Anthropic counts them apart), the cache's
reads also as ``prompt_tokens_details.cached_tokens``. Streamed: a role chunk at
``message_start``, a content (or ``reasoning_content``) delta per text delta, a ``tool_calls``
delta with the call's index, id and name at its block's start and one per ``input_json_delta``,
the ``finish_reason`` and ``usage`` in one last chunk at ``message_delta``, ``data: [DONE]`` at
``message_stop``; an ``error`` event becomes OpenAI's ``data: {"error": …}`` chunk and ends it.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping
from typing import Any

from ..._errors import ServerError, StreamError
from ...client import SSEDecoder
from ..edge._errors_http import error_body
from ._to_messages import DEFAULT_MAX_TOKENS, messages_body

__all__ = ["DEFAULT_MAX_TOKENS", "ChatAnswer", "messages_body"]

_FINISH = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "pause_turn": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
}

#: Anthropic's error type → (HTTP status, OpenAI's error type), for its stream's ``error`` event.
_ERRORS = {
    "invalid_request_error": (400, "invalid_request_error"),
    "authentication_error": (401, "authentication_error"),
    "billing_error": (402, "insufficient_quota"),
    "permission_error": (403, "permission_error"),
    "not_found_error": (404, "not_found_error"),
    "request_too_large": (413, "invalid_request_error"),
    "rate_limit_error": (429, "rate_limit_error"),
    "api_error": (500, "server_error"),
    "timeout_error": (504, "server_error"),
    "overloaded_error": (529, "unavailable_error"),
}


# -- the answer ----------------------------------------------------------------------------------


def _chat_id(message_id: Any) -> str:
    text = message_id if isinstance(message_id, str) else ""
    if text.startswith("chatcmpl-"):
        return text
    return "chatcmpl-" + (text.removeprefix("msg_") or uuid.uuid4().hex[:24])


def _count(usage: Mapping[str, Any], key: str) -> int:
    value = usage.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _usage(usage: Any) -> dict[str, Any]:
    """OpenAI's usage from Anthropic's: the prompt is what Anthropic counts apart, all of it."""
    used: Mapping[str, Any] = usage if isinstance(usage, Mapping) else {}
    cached = _count(used, "cache_read_input_tokens")
    prompt = _count(used, "input_tokens") + cached + _count(used, "cache_creation_input_tokens")
    completion = _count(used, "output_tokens")
    out: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }
    if cached:
        out["prompt_tokens_details"] = {"cached_tokens": cached}
    return out


def _finish(reason: Any) -> str:
    return _FINISH.get(reason, "stop") if isinstance(reason, str) else "stop"


def _untranslatable(what: str) -> ServerError:
    return ServerError(
        f"the upstream's answer is not an Anthropic message: {what}",
        hint="check that the model's upstream speaks Anthropic's Messages API",
        status_code=502,
    )


def _dumps(data: Mapping[str, Any]) -> str:
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"))


class ChatAnswer:
    """The upstream's Anthropic answer in OpenAI chat's shape: one completion, or its chunks.
    One per request: the stream's decoder and its tool calls' indices live here between chunks."""

    stream_type = "text/event-stream"
    whole_type = "application/json"

    def __init__(self, model: str, *, created: int | None = None) -> None:
        self.model = model
        self.created = int(time.time()) if created is None else created
        self.over = False
        self._decoder = SSEDecoder()
        self._id = _chat_id(None)
        self._started = False
        self._calls: dict[int, int] = {}  # a tool_use block's index → its OpenAI tool call index
        self._usage: dict[str, Any] = {}
        self._finished = False

    # -- whole

    def whole(self, content: bytes) -> bytes:
        try:
            data = json.loads(content)
        except ValueError:
            raise _untranslatable("it is not JSON") from None
        if not isinstance(data, dict):
            raise _untranslatable("it is not a JSON object")
        if data.get("type") == "error":
            error = data.get("error")
            said = error.get("message") if isinstance(error, Mapping) else None
            raise _untranslatable(f"it is an error ({said or error!r})")
        blocks = data.get("content")
        if data.get("type") != "message" or not isinstance(blocks, list):
            raise _untranslatable('it has no "type": "message" and "content" array')
        texts: list[str] = []
        thoughts: list[str] = []
        calls: list[dict[str, Any]] = []
        for block in blocks:
            if not isinstance(block, Mapping):
                raise _untranslatable("a content block is not an object")
            kind = block.get("type")
            if kind == "text":
                texts.append(str(block.get("text") or ""))
            elif kind == "thinking":
                thoughts.append(str(block.get("thinking") or ""))
            elif kind == "tool_use":
                arguments = json.dumps(block.get("input") or {}, ensure_ascii=False)
                calls.append(
                    {
                        "id": str(block.get("id") or "call_" + uuid.uuid4().hex[:24]),
                        "type": "function",
                        "function": {"name": str(block.get("name") or ""), "arguments": arguments},
                    }
                )
            # redacted thinking, the upstream's own server tools: nothing in OpenAI's shape holds them
        message: dict[str, Any] = {
            "role": "assistant",
            "content": "".join(texts) if texts or not calls else None,
            "refusal": None,
        }
        if thoughts:
            message["reasoning_content"] = "".join(thoughts)
        if calls:
            message["tool_calls"] = calls
        reply = {
            "id": _chat_id(data.get("id")),
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": _finish(data.get("stop_reason")),
                }
            ],
            "usage": _usage(data.get("usage")),
        }
        return _dumps(reply).encode()

    # -- streamed

    def feed(self, chunk: bytes) -> bytes:
        out: list[bytes] = []
        for ev in self._decoder.feed(chunk):
            if self.over:
                break
            if not ev.data:
                continue
            try:
                data = json.loads(ev.data)
            except ValueError:
                raise StreamError(
                    f"the upstream's Anthropic stream carried an event that is not JSON: {ev.data[:80]!r}"
                ) from None
            if not isinstance(data, dict):
                raise StreamError("the upstream's Anthropic stream carried an event that is not an object")
            kind = data.get("type")
            out += self._event(kind if isinstance(kind, str) else ev.event, data)
        return b"".join(out)

    def end(self) -> bytes:
        """Nothing: a stream that ended without ``message_stop`` was cut, and the forwarder says
        so with an error chunk (``[DONE]`` would tell the client the answer is whole)."""
        return b""

    def _event(self, kind: str, data: Mapping[str, Any]) -> list[bytes]:
        if kind == "message_start":
            message = data.get("message")
            if isinstance(message, Mapping):
                if not self._started:
                    self._id = _chat_id(message.get("id"))
                self._merge(message.get("usage"))
            return self._begin()
        if kind == "content_block_start":
            block = data.get("content_block")
            return self._begin() + (self._block(data, block) if isinstance(block, Mapping) else [])
        if kind == "content_block_delta":
            delta = data.get("delta")
            return self._begin() + (self._delta(data, delta) if isinstance(delta, Mapping) else [])
        if kind == "message_delta":
            self._merge(data.get("usage"))
            delta = data.get("delta")
            reason = delta.get("stop_reason") if isinstance(delta, Mapping) else None
            return self._begin() + self._last(reason)
        if kind == "message_stop":
            out = self._begin() + ([] if self._finished else self._last(None))
            self.over = True
            return [*out, b"data: [DONE]\n\n"]
        if kind == "error":
            self.over = True
            return [self._error(data.get("error"))]
        return []  # ping, content_block_stop, and any event Anthropic adds later

    def _begin(self) -> list[bytes]:
        if self._started:
            return []
        self._started = True
        return [self._chunk({"role": "assistant", "content": ""})]

    def _block(self, data: Mapping[str, Any], block: Mapping[str, Any]) -> list[bytes]:
        kind = block.get("type")
        if kind == "text" and block.get("text"):
            return [self._chunk({"content": str(block["text"])})]
        if kind == "thinking" and block.get("thinking"):
            return [self._chunk({"reasoning_content": str(block["thinking"])})]
        if kind != "tool_use" or not isinstance(data.get("index"), int):
            return []
        call = self._calls[data["index"]] = len(self._calls)
        given = block.get("input")
        start = {
            "index": call,
            "id": str(block.get("id") or "call_" + uuid.uuid4().hex[:24]),
            "type": "function",
            "function": {
                "name": str(block.get("name") or ""),
                "arguments": json.dumps(given, ensure_ascii=False) if given else "",
            },
        }
        return [self._chunk({"tool_calls": [start]})]

    def _delta(self, data: Mapping[str, Any], delta: Mapping[str, Any]) -> list[bytes]:
        kind = delta.get("type")
        if kind == "text_delta" and delta.get("text"):
            return [self._chunk({"content": str(delta["text"])})]
        if kind == "thinking_delta" and delta.get("thinking"):
            return [self._chunk({"reasoning_content": str(delta["thinking"])})]
        call = self._calls.get(data["index"]) if isinstance(data.get("index"), int) else None
        if kind == "input_json_delta" and call is not None and delta.get("partial_json"):
            pieces = {"index": call, "function": {"arguments": str(delta["partial_json"])}}
            return [self._chunk({"tool_calls": [pieces]})]
        return []  # a signature, a citation, a server tool's input: nothing OpenAI has

    def _merge(self, usage: Any) -> None:
        """Anthropic's counts so far: ``message_start`` has the prompt's, ``message_delta`` the
        answer's (cumulative), a field it leaves out or null is kept."""
        if isinstance(usage, Mapping):
            self._usage.update({k: v for k, v in usage.items() if v is not None})

    def _last(self, reason: Any) -> list[bytes]:
        if self._finished:
            return []
        self._finished = True
        return [self._chunk({}, finish=_finish(reason), usage=_usage(self._usage))]

    def _chunk(
        self, delta: dict[str, Any], *, finish: str | None = None, usage: dict[str, Any] | None = None
    ) -> bytes:
        body: dict[str, Any] = {
            "id": self._id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }
        if usage is not None:
            body["usage"] = usage
        return b"data: " + _dumps(body).encode() + b"\n\n"

    def _error(self, error: Any) -> bytes:
        if isinstance(error, Mapping):
            message = str(error.get("message") or "the upstream failed mid-stream")
            status, kind = _ERRORS.get(str(error.get("type")), (500, "server_error"))
        else:
            message, (status, kind) = str(error or "the upstream failed mid-stream"), (500, "server_error")
        return b"data: " + _dumps(error_body(message, kind, status)).encode() + b"\n\n"
