"""What one answer used: its prompt and completion tokens, read from what the child sent back.

Every route and dialect charges a key the same way (``_recording.note_answer`` → the record →
``Recorder.finish``, which adds to the key's day and the metrics), and this module is where the
counts come from, whatever shape the answer had:

* a ``usage`` object (OpenAI, and the Responses API, when asked or not streamed; Anthropic,
  whose ``input_tokens`` leave out the ``cache_read_input_tokens``: they are added back, so the
  prompt is the whole prompt in every dialect, cached or not — a charge must not depend on which
  slot another key's request left warm);
* else llama-server's ``timings`` (``cache_n + prompt_n`` read, ``predicted_n`` produced), which
  its last streamed event carries even when the client did not ask ``stream_options.include_usage``
  (the OpenAI SDK's default);
* else the native routes' ``tokens_evaluated`` / ``tokens_predicted``, in every streamed event.

A stream the client left before its end has none of these in its tail (but the native routes):
:class:`StreamMeter` then charges what was produced so far — one token per event that carried
generated text (llama-server sends one event per token; a token that completes no character
sends none, so this never counts more than was produced) — and the prompt when the stream had
said it (Anthropic's ``message_start``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

__all__ = ["StreamMeter", "Used", "ends_stream", "used_in"]

_DECODER = json.JSONDecoder()
_TAIL = 4096
_HEAD = 65536  # the most of a stream's start kept to find Anthropic's message_start in
_NATIVE = re.compile(rb'"tokens_(predicted|evaluated)"\s*:\s*(\d+)')

#: Per streamed route, what marks an event that carries one generated token (for a stream cut
#: short). The chat routes' role-only first event and their empty last one are not counted.
_CHAT = (b'"delta":{"content"', b'"delta":{"reasoning_content"', b'"delta":{"tool_calls"')
_TOKEN_EVENTS: dict[str, tuple[bytes, ...]] = {
    "/v1/chat/completions": _CHAT,
    "/chat/completions": _CHAT,
    "/v1/completions": (b'"finish_reason":null',),
    "/v1/messages": (b'"type":"content_block_delta"',),
    "/v1/responses": (b'.delta"',),
    "/responses": (b'.delta"',),
}


#: The ``type`` of the event that ends a stream (Anthropic's Messages, the Responses API).
_END_TYPES = frozenset({"message_stop", "response.completed"})


def ends_stream(tail: bytes) -> bool:
    """Whether the last whole event of a stream's ``tail`` is the event that ends it: OpenAI's
    ``data: [DONE]``, an event whose ``type`` is ``message_stop`` or ``response.completed``, or
    llama-server's native ``"stop": true``. Read from the event itself, not by finding the marker
    anywhere in the bytes: generated text may hold ``[DONE]`` or ``message_stop`` too. An end event
    longer than the tail (a long ``response.completed``) is not recognised: the answer is then
    taken as unfinished, the side that never calls a cut answer whole."""
    for block in reversed(tail.replace(b"\r\n", b"\n").split(b"\n\n")):
        lines = [line[5:].strip() for line in block.split(b"\n") if line.startswith(b"data:")]
        if not lines:
            continue  # a comment (a ping) or the empty piece after the last event
        data = b"\n".join(lines)
        if data == b"[DONE]":
            return True
        try:
            event = json.loads(data)
        except ValueError:
            return False
        return isinstance(event, dict) and (event.get("type") in _END_TYPES or event.get("stop") is True)
    return False


@dataclass
class Used:
    """Tokens of one answer; None: not known."""

    prompt: int | None = None
    completion: int | None = None
    cached: int | None = None


def _int(value: Any) -> int | None:
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def _last_object(body: bytes, key: bytes) -> dict[str, Any] | None:
    """The JSON object that follows the last ``"key":`` in ``body`` (None: none, or cut off)."""
    return _object_at(body, body.rfind(b'"' + key + b'"'))


def _object_at(body: bytes, i: int) -> dict[str, Any] | None:
    """The JSON object that follows position ``i`` of ``body`` (None: ``i`` < 0, or cut off)."""
    if i < 0:
        return None
    try:
        start = body.index(b"{", i)
        found, _ = _DECODER.raw_decode(body[start:].decode("utf-8", "replace"))
    except ValueError:
        return None
    return found if isinstance(found, dict) else None


def _from_usage(usage: dict[str, Any]) -> Used:
    prompt = _int(usage.get("prompt_tokens", usage.get("input_tokens")))
    completion = _int(usage.get("completion_tokens", usage.get("output_tokens")))
    cached = _int(usage.get("cache_read_input_tokens"))  # Anthropic's: not in its input_tokens
    if cached is not None and prompt is not None:
        prompt += cached
    details = usage.get("prompt_tokens_details") or usage.get("input_tokens_details")
    if cached is None and isinstance(details, dict):
        cached = _int(details.get("cached_tokens"))
    return Used(prompt, completion, cached)


def _from_timings(timings: dict[str, Any]) -> Used | None:
    read, cached, produced = (_int(timings.get(k)) for k in ("prompt_n", "cache_n", "predicted_n"))
    if read is None and produced is None:
        return None
    return Used((read or 0) + (cached or 0), produced, cached)


def used_in(body: bytes) -> Used | None:
    """The counts an answer (a whole body, or a stream's tail) says, by the module's order."""
    usage = _last_object(body, b"usage")
    if usage is not None:
        used = _from_usage(usage)
        if used.completion is not None or used.prompt is not None:
            return used
    timings = _last_object(body, b"timings")
    read = _from_timings(timings) if timings is not None else None
    if read is not None:
        return read
    native = dict(_NATIVE.findall(body))  # the last of each wins
    if native:
        return Used(_int(native.get(b"evaluated")), _int(native.get(b"predicted")))
    return None


class StreamMeter:
    """A stream's counts as it passes: its tail (for the last event's usage or timings), the
    events that carried a token, and the prompt where the stream says it at its start."""

    __slots__ = ("_head", "_marks", "events", "prompt", "tail")

    def __init__(self, path: str) -> None:
        self._marks = _TOKEN_EVENTS.get(path, ())
        self.tail = b""
        self.events = 0
        self.prompt: Used | None = None  # Anthropic's message_start: the prompt (and its cached part)
        #: The stream's first bytes, until Anthropic's ``message_start`` has been read from them
        #: (None: not a ``/v1/messages`` stream, or read, or given up on).
        self._head: bytes | None = b"" if path == "/v1/messages" else None

    def feed(self, chunk: bytes) -> None:
        if self._head is not None:  # before the tail drops a long block's older part
            self._read_start(self._head + chunk)
        self.tail = (self.tail + chunk)[-_TAIL:]
        for mark in self._marks:
            self.events += chunk.count(mark)

    def _read_start(self, head: bytes) -> None:
        """The prompt from ``message_start``'s usage, read from the stream's first bytes once that
        event is there whole, however the chunks cut it. Not from the tail: a busy gateway reads a
        fast stream's events many at a time, and one block of a 40-token stream is longer than the
        tail, its first event (the only one that says the prompt) already dropped."""
        i = head.find(b'"message_start"')
        event = _object_at(head, head.rfind(b"data:", 0, i)) if i >= 0 else None
        if event is None:  # not (whole) yet; a stream that never says it is not read for ever
            self._head = head if len(head) <= _HEAD else None
            return
        self._head = None
        message = event.get("message")
        usage = message.get("usage") if isinstance(message, dict) else None
        self.prompt = _from_usage(usage) if isinstance(usage, dict) else Used()

    def used(self) -> Used:
        """What the stream used: as its end said, else what it produced so far. The events never
        outnumber the tokens, so the larger count is the truer one (a stream cut after Anthropic's
        ``message_start`` has that event's ``output_tokens: 0`` as its last usage)."""
        said = used_in(self.tail) or Used()
        start = self.prompt or Used()
        completion: int | None = max(said.completion or 0, self.events)
        if not completion and said.completion is None:
            completion = None
        return Used(
            said.prompt or start.prompt,  # Anthropic's last usage has no prompt: its start had
            completion,
            said.cached if said.cached is not None else start.cached,
        )
