"""Anthropic's Messages API ⇄ OpenAI chat, for a model whose server speaks only OpenAI chat.

A llama-server model answers ``/v1/messages`` itself and the gateway passes it through untouched
(llama-server's own translation keeps every field it knows). A ``backend = "command"`` model whose
``routes`` have ``/v1/chat/completions`` but not ``/v1/messages`` (vLLM, SGLang, koboldcpp…) gets
the request translated here, both ways, on the one request path: the body has met every ingress
check in Anthropic's terms first (fields, the key's models, a variant's rules, the length, tools,
media), then :func:`chat_body` makes the OpenAI request and :class:`AnthropicAnswer` (a
:class:`~..core._dialect.Translator`) turns the child's answer, whole or streamed, into
Anthropic's. The child's OpenAI answer is what is metered and charged, before it is translated.

Request: ``system`` (a string or text blocks) becomes a system message; text blocks, ``image``
blocks (base64 or url → ``image_url`` parts), ``tool_use`` blocks of an assistant turn
(→ ``tool_calls``), ``tool_result`` blocks of a user turn (→ ``role: "tool"`` messages);
``tools`` (→ functions with ``input_schema`` as their parameters), ``tool_choice``
(auto/any/tool/none → auto/required/the function/none), ``stop_sequences`` → ``stop``;
``max_tokens``, ``temperature``, ``top_p``, ``top_k`` and any field this module does not know
pass through; ``metadata``, ``thinking`` and thinking blocks are dropped. A streamed request asks
``stream_options.include_usage`` so that the prompt's count arrives.

Answer: text, reasoning (as ``thinking`` blocks) and tool calls (``tool_use`` blocks, their
``input`` parsed) in order, ``stop_reason`` (end_turn / max_tokens / tool_use / stop_sequence),
``usage`` (``input_tokens``, ``output_tokens``; a cached part as ``cache_read_input_tokens``).
Streamed: ``message_start`` … ``message_stop``, one content block at a time (one per tool call,
its arguments as ``input_json_delta`` as they come); the prompt's count is known only at the end
of an OpenAI stream, so ``message_start`` says 0 and ``message_delta``'s usage has the real counts.
A child's error event becomes Anthropic's ``event: error``.

``/v1/messages/count_tokens`` needs the server's tokenizer, which an OpenAI chat server does not
offer on any route forge knows: it is a 400 saying so (an estimate would be a wrong number that
looks right).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from typing import Any

from ..._errors import InvalidRequest
from ...client import SSEDecoder
from ...config import ModelConfig
from ...supervisor import backend_of
from ..edge._errors_http import shape_error

__all__ = ["AnthropicAnswer", "chat_body", "refuse_count_tokens", "translates"]

CHAT = "/v1/chat/completions"
MESSAGES = "/v1/messages"
COUNT_TOKENS = "/v1/messages/count_tokens"

#: Anthropic's request fields that are translated (or dropped) here; any other passes through.
_OWN = frozenset(
    {
        "system", "messages", "tools", "tool_choice", "stop_sequences", "metadata", "thinking",
        "stream", "service_tier", "container", "mcp_servers", "context_management",
    }
)  # fmt: skip

_STOP_REASONS = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "refusal",
}


# -- which requests ----------------------------------------------------------------------------------


def translates(config: ModelConfig, path: str) -> bool:
    """Whether an Anthropic request on ``path`` goes to the model's OpenAI chat route, translated:
    its server answers OpenAI chat and not ``/v1/messages`` (a llama-server model answers it
    itself: passed through)."""
    backend = backend_of(config)
    return path == MESSAGES and not backend.serves(config, MESSAGES) and backend.serves(config, CHAT)


def refuse_count_tokens(name: str, config: ModelConfig, path: str) -> None:
    """A 400 saying why, for ``/v1/messages/count_tokens`` to a model whose messages are
    translated (its server answers neither that route nor any tokenizer route forge knows)."""
    backend = backend_of(config)
    if path != COUNT_TOKENS or backend.serves(config, COUNT_TOKENS) or not backend.serves(config, CHAT):
        return
    raise InvalidRequest(
        f"model {name!r} cannot count tokens: its server answers OpenAI chat only (its routes have "
        f"no {COUNT_TOKENS}), and forge has no tokenizer of its own for it; /v1/messages to it is "
        "translated to OpenAI chat and answers with its usage",
        param="model",
        hint=f"add {COUNT_TOKENS!r} to the model's routes if its server answers it, or read the "
        "usage of a /v1/messages answer",
    )


# -- the request ---------------------------------------------------------------------------------


def _bad(where: str, what: str) -> InvalidRequest:
    return InvalidRequest(f"field {where!r} {what}", param=where, hint=f"fix {where!r}")


def _blocks(content: Any, where: str) -> list[dict[str, Any]]:
    """``content`` as a list of blocks (a string is one text block)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if content is None:
        return []
    if not isinstance(content, list):
        raise _bad(where, "must be a string or an array of content blocks")
    for j, block in enumerate(content):
        if not isinstance(block, Mapping) or not isinstance(block.get("type"), str):
            raise _bad(f"{where}[{j}]", 'must be a content block (an object with a "type")')
    return content


def _text_of(content: Any, where: str) -> str:
    """The text of a string or of text blocks (others are dropped: a system prompt has no media)."""
    return "\n".join(str(b.get("text") or "") for b in _blocks(content, where) if b["type"] == "text")


def _image_part(block: Mapping[str, Any], where: str) -> dict[str, Any]:
    source = block.get("source")
    if not isinstance(source, Mapping):
        raise _bad(f"{where}.source", "must be an object")
    if source.get("type") == "url":
        url = str(source.get("url") or "")
    else:
        media = str(source.get("media_type") or "image/png")
        url = f"data:{media};base64,{source.get('data') or ''}"
    return {"type": "image_url", "image_url": {"url": url}}


def _parts(blocks: list[dict[str, Any]], where: str) -> str | list[dict[str, Any]]:
    """Text and image blocks as OpenAI content: a string when it is all text."""
    parts: list[dict[str, Any]] = []
    for j, block in enumerate(blocks):
        if block["type"] == "text":
            parts.append({"type": "text", "text": str(block.get("text") or "")})
        elif block["type"] == "image":
            parts.append(_image_part(block, f"{where}[{j}]"))
    if all(p["type"] == "text" for p in parts):
        return "".join(p["text"] for p in parts)
    return parts


def _tool_results(block: Mapping[str, Any], where: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A ``tool_result`` block: its ``role: "tool"`` message, and the images it held (sent in a
    user message after it: an OpenAI tool message is text)."""
    blocks = _blocks(block.get("content"), f"{where}.content")
    text = "\n".join(str(b.get("text") or "") for b in blocks if b["type"] == "text")
    if block.get("is_error") and text:
        text = f"Error: {text}"
    images = [_image_part(b, f"{where}.content") for b in blocks if b["type"] == "image"]
    call = block.get("tool_use_id")
    if not isinstance(call, str):
        raise _bad(f"{where}.tool_use_id", "must be a string")
    return {"role": "tool", "tool_call_id": call, "content": text}, images


def _user(blocks: list[dict[str, Any]], where: str) -> list[dict[str, Any]]:
    """A user turn: its tool results first (they answer the turn before), then what it says."""
    out: list[dict[str, Any]] = []
    images: list[dict[str, Any]] = []
    rest: list[dict[str, Any]] = []
    for j, block in enumerate(blocks):
        if block["type"] == "tool_result":
            message, held = _tool_results(block, f"{where}[{j}]")
            out.append(message)
            images += held
        else:
            rest.append(block)
    content = _parts(rest, where)
    if images:
        content = [{"type": "text", "text": content}] if isinstance(content, str) else content
        content = [p for p in content if p.get("type") != "text" or p.get("text")] + images
    if content or not out:
        out.append({"role": "user", "content": content})
    return out


def _assistant(blocks: list[dict[str, Any]], where: str) -> dict[str, Any]:
    text = "".join(str(b.get("text") or "") for b in blocks if b["type"] == "text")
    message: dict[str, Any] = {"role": "assistant", "content": text}
    calls = []
    for j, block in enumerate(blocks):
        if block["type"] != "tool_use":
            continue  # thinking and redacted thinking are the model's own: not sent back
        name, call = block.get("name"), block.get("id")
        if not isinstance(name, str) or not isinstance(call, str):
            raise _bad(f"{where}[{j}]", 'must have a string "id" and "name"')
        arguments = json.dumps(block.get("input") or {}, ensure_ascii=False)
        calls.append({"id": call, "type": "function", "function": {"name": name, "arguments": arguments}})
    if calls:
        message["tool_calls"] = calls
        if not text:
            message["content"] = None
    return message


def _messages(messages: Any) -> list[dict[str, Any]]:
    if not isinstance(messages, list):
        raise _bad("messages", "must be an array")
    out: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, Mapping) or m.get("role") not in ("user", "assistant"):
            raise _bad(where, 'must be an object with "role" "user" or "assistant"')
        blocks = _blocks(m.get("content"), f"{where}.content")
        if m["role"] == "user":
            out += _user(blocks, f"{where}.content")
        else:
            out.append(_assistant(blocks, f"{where}.content"))
    return out


def _tools(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise _bad("tools", "must be an array")
    out = []
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, Mapping) or not isinstance(tool.get("name"), str):
            raise _bad(where, 'must be an object with a "name"')
        kind = tool.get("type")
        if kind not in (None, "custom") and "input_schema" not in tool:
            raise InvalidRequest(
                f"tool {tool['name']!r} ({kind}) is one of Anthropic's server tools: this model's "
                "server runs only the tools a request defines",
                param=where,
                hint="define the tool with an input_schema, or send the request without it",
            )
        function: dict[str, Any] = {
            "name": tool["name"],
            "parameters": tool.get("input_schema") or {"type": "object", "properties": {}},
        }
        if tool.get("description"):
            function["description"] = tool["description"]
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(choice: Any, chat: dict[str, Any]) -> None:
    if choice is None:
        return
    if not isinstance(choice, Mapping) or not isinstance(choice.get("type"), str):
        raise _bad("tool_choice", 'must be an object with a "type"')
    kind = choice["type"]
    if kind == "auto":
        chat["tool_choice"] = "auto"
    elif kind == "any":
        chat["tool_choice"] = "required"
    elif kind == "none":
        chat["tool_choice"] = "none"
    elif kind == "tool" and isinstance(choice.get("name"), str):
        chat["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    else:
        raise _bad("tool_choice", 'must be {"type": "auto" | "any" | "none"} or {"type": "tool", "name": …}')
    if choice.get("disable_parallel_tool_use") is True:
        chat["parallel_tool_calls"] = False


def chat_body(payload: Mapping[str, Any]) -> dict[str, Any]:
    """An Anthropic Messages request (already checked) as an OpenAI chat completion request."""
    chat: dict[str, Any] = {k: v for k, v in payload.items() if k not in _OWN}
    messages: list[dict[str, Any]] = []
    system = payload.get("system")
    if system:
        messages.append({"role": "system", "content": _text_of(system, "system")})
    messages += _messages(payload.get("messages") or [])
    chat["messages"] = messages
    if payload.get("tools"):
        chat["tools"] = _tools(payload["tools"])
        _tool_choice(payload.get("tool_choice"), chat)
    elif (payload.get("tool_choice") or {}) == {"type": "none"}:
        chat["tool_choice"] = "none"
    if payload.get("stop_sequences") is not None:
        chat["stop"] = payload["stop_sequences"]
    if payload.get("stream") is True:
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    return chat


# -- the answer ----------------------------------------------------------------------------------


def _message_id(openai_id: Any) -> str:
    text = str(openai_id or "")
    return "msg_" + (text.removeprefix("chatcmpl-") or uuid.uuid4().hex[:24])


def _call_id(call_id: Any) -> str:
    return call_id if isinstance(call_id, str) and call_id else "toolu_" + uuid.uuid4().hex[:24]


def _usage(data: Mapping[str, Any]) -> dict[str, int] | None:
    """Anthropic's usage from an OpenAI answer's ``usage`` (else llama-server's ``timings``): the
    prompt's cached part apart, as Anthropic counts it. None: the answer says neither."""
    usage, timings = data.get("usage"), data.get("timings")
    if isinstance(usage, Mapping) and (
        usage.get("prompt_tokens") is not None or usage.get("completion_tokens")
    ):
        prompt = int(usage.get("prompt_tokens") or 0)
        details = usage.get("prompt_tokens_details")
        cached = int((details or {}).get("cached_tokens") or 0) if isinstance(details, Mapping) else 0
        completion = int(usage.get("completion_tokens") or 0)
    elif isinstance(timings, Mapping) and timings.get("predicted_n") is not None:
        cached = int(timings.get("cache_n") or 0)
        prompt = int(timings.get("prompt_n") or 0) + cached
        completion = int(timings.get("predicted_n") or 0)
    else:
        return None
    out = {"input_tokens": prompt - cached, "output_tokens": completion}
    if cached:
        out["cache_read_input_tokens"] = cached
    return out


def _arguments(text: Any) -> Any:
    if isinstance(text, Mapping):
        return dict(text)
    try:
        parsed = json.loads(text) if isinstance(text, str) and text.strip() else {}
    except ValueError:
        return {"_raw": text}  # the model wrote invalid JSON: kept visible, not a crash
    return parsed if isinstance(parsed, dict) else {"_value": parsed}


class AnthropicAnswer:
    """The child's OpenAI chat answer in Anthropic's shape: one message, or its event stream.
    One per request: the stream's decoder and its open content block live here between chunks."""

    stream_type = "text/event-stream"
    whole_type = "application/json"

    def __init__(self, model: str, stop_sequences: Any = None) -> None:
        self.model = model
        self.stops = [s for s in stop_sequences or () if isinstance(s, str)]
        self.over = False
        self._decoder = SSEDecoder()
        self._started = False
        self._blocks = 0  # content blocks begun so far
        self._open: tuple[str, int] | None = None  # (kind, tool call index or -1), its block
        self._tools: dict[int, int] = {}  # the OpenAI tool call index → its content block
        self._reason: str | None = None
        self._stop: str | None = None
        self._usage: dict[str, int] | None = None
        self._produced = 0

    # -- whole

    def _stop_reason(self, choice: Mapping[str, Any], calls: bool) -> tuple[str, str | None]:
        reason = choice.get("finish_reason")
        matched = choice.get("stop_reason")  # vLLM's: the stop string that ended the answer
        if reason == "stop" and isinstance(matched, str) and matched in self.stops:
            return "stop_sequence", matched
        if calls and reason in (None, "stop"):
            return "tool_use", None
        return _STOP_REASONS.get(str(reason), "end_turn"), None

    def whole(self, content: bytes) -> bytes:
        data = json.loads(content)
        choices = data.get("choices") or [{}]
        choice = choices[0] if isinstance(choices[0], Mapping) else {}
        message = choice.get("message") or {}
        blocks: list[dict[str, Any]] = []
        if message.get("reasoning_content"):
            blocks.append({"type": "thinking", "thinking": message["reasoning_content"], "signature": ""})
        if message.get("content"):
            blocks.append({"type": "text", "text": message["content"]})
        calls = message.get("tool_calls") or []
        for call in calls:
            fn = call.get("function") or {}
            blocks.append(
                {
                    "type": "tool_use",
                    "id": _call_id(call.get("id")),
                    "name": fn.get("name") or "",
                    "input": _arguments(fn.get("arguments")),
                }
            )
        reason, stop = self._stop_reason(choice, bool(calls))
        reply = {
            "id": _message_id(data.get("id")),
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": blocks,
            "stop_reason": reason,
            "stop_sequence": stop,
            "usage": _usage(data) or {"input_tokens": 0, "output_tokens": 0},
        }
        return json.dumps(reply, ensure_ascii=False, separators=(",", ":")).encode()

    # -- streamed

    def feed(self, chunk: bytes) -> bytes:
        out: list[bytes] = []
        for ev in self._decoder.feed(chunk):
            if self.over or not ev.data:
                continue
            if ev.data == "[DONE]":
                out += self._finish()
                self.over = True
                break
            try:
                data = json.loads(ev.data)
            except ValueError:
                continue
            if not isinstance(data, dict):
                continue
            if "error" in data:
                out.append(self._error(data["error"]))
                self.over = True
                break
            out += self._chunk(data)
        return b"".join(out)

    def end(self) -> bytes:
        """Nothing: a stream that ended without ``[DONE]`` was cut, and the forwarder says so
        with an error event (``message_stop`` would tell the client the answer is whole)."""
        return b""

    def _start(self, data: Mapping[str, Any]) -> list[bytes]:
        if self._started:
            return []
        self._started = True
        message: dict[str, Any] = {
            "id": _message_id(data.get("id")),
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0},
        }
        return [_event("message_start", {"message": message})]

    def _chunk(self, data: Mapping[str, Any]) -> list[bytes]:
        out = self._start(data)
        used = _usage(data)
        if used is not None:
            self._usage = used
        for choice in data.get("choices") or []:
            if not isinstance(choice, Mapping):
                continue
            delta = choice.get("delta") or {}
            if delta.get("reasoning_content"):
                out += self._block("thinking", -1, {"type": "thinking", "thinking": "", "signature": ""})
                out.append(self._delta({"type": "thinking_delta", "thinking": delta["reasoning_content"]}))
                self._produced += 1
            if delta.get("content"):
                out += self._block("text", -1, {"type": "text", "text": ""})
                out.append(self._delta({"type": "text_delta", "text": delta["content"]}))
                self._produced += 1
            for frag in delta.get("tool_calls") or []:
                out += self._tool(frag)
            if choice.get("finish_reason"):
                self._reason, self._stop = self._stop_reason(choice, bool(self._tools))
        return out

    def _tool(self, frag: Mapping[str, Any]) -> list[bytes]:
        index = int(frag.get("index") or 0)
        fn = frag.get("function") or {}
        out: list[bytes] = []
        if index not in self._tools:
            start: dict[str, Any] = {
                "type": "tool_use",
                "id": _call_id(frag.get("id")),
                "name": fn.get("name") or "",
                "input": {},
            }
            out += self._block("tool", index, start)
            self._tools[index] = self._blocks - 1
        pieces = fn.get("arguments")
        if pieces:
            # A call's pieces go on its own block (servers send one call after another).
            delta = {"type": "input_json_delta", "partial_json": pieces}
            out.append(_event("content_block_delta", {"index": self._tools[index], "delta": delta}))
            self._produced += 1
        return out

    def _block(self, kind: str, index: int, start: dict[str, Any]) -> list[bytes]:
        """The content block for ``kind`` open (a new one if another kind is open)."""
        if self._open == (kind, index) and kind != "tool":
            return []
        out = self._close()
        self._open = (kind, index)
        out.append(_event("content_block_start", {"index": self._blocks, "content_block": start}))
        self._blocks += 1
        return out

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return _event("content_block_delta", {"index": self._blocks - 1, "delta": delta})

    def _close(self) -> list[bytes]:
        if self._open is None:
            return []
        self._open = None
        return [_event("content_block_stop", {"index": self._blocks - 1})]

    def _finish(self) -> list[bytes]:
        out = self._start({})
        out += self._close()
        used = dict(self._usage or {"input_tokens": 0, "output_tokens": self._produced})
        reason = self._reason or ("tool_use" if self._tools else "end_turn")
        delta = {"stop_reason": reason, "stop_sequence": self._stop}
        out.append(_event("message_delta", {"delta": delta, "usage": used}))
        out.append(_event("message_stop", {}))
        return out

    def _error(self, error: Any) -> bytes:
        if isinstance(error, Mapping):
            message = str(error.get("message") or error)
            code = error.get("code")
            status = code if isinstance(code, int) else 500
        else:
            message, status = str(error), 500
        body = shape_error("anthropic", status, message, "server_error")
        return b"event: error\ndata: " + json.dumps(body, ensure_ascii=False).encode() + b"\n\n"


def _event(kind: str, data: dict[str, Any]) -> bytes:
    body = json.dumps({"type": kind, **data}, ensure_ascii=False, separators=(",", ":"))
    return f"event: {kind}\ndata: {body}\n\n".encode()
