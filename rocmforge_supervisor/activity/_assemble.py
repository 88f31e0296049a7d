"""A captured streamed response as the text a user read, plus its usage: what the log keeps.

The relay keeps the raw bytes of a stream (bounded); this runs on the store's thread, so the
event loop never parses a captured stream. It knows the shapes of every dialect the gateway
relays: OpenAI's chat and completion chunks, the Responses API's deltas, Anthropic's
``content_block_delta``, llama-server's native ``content``, and Ollama's NDJSON lines.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["assembled_text"]


def assembled_text(raw: bytes) -> str:
    """The text of an SSE or NDJSON stream, and its last usage object on a line of its own
    (``[usage] {...}``) when the stream carried one. Unknown events are skipped, never fatal."""
    pieces: list[str] = []
    usage: Any = None
    for line in raw.decode("utf-8", "replace").splitlines():
        line = line.strip()
        if line.startswith("data:"):
            line = line[5:].strip()
        if not line.startswith("{"):
            continue
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if not isinstance(event, dict):
            continue
        pieces.append(_piece(event))
        found = _usage(event)
        if found is not None:
            usage = found
    text = "".join(pieces)
    if usage is not None:
        text += "\n[usage] " + json.dumps(usage, separators=(",", ":"))
    return text


def _piece(event: dict[str, Any]) -> str:
    choices = event.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        first = choices[0]
        delta = first.get("delta")
        if isinstance(delta, dict):
            return str(delta.get("content") or "")
        return str(first.get("text") or "")
    kind = event.get("type")
    if kind == "content_block_delta":  # Anthropic
        delta = event.get("delta")
        return str(delta.get("text") or "") if isinstance(delta, dict) else ""
    if kind == "response.output_text.delta":  # the Responses API
        return str(event.get("delta") or "")
    message = event.get("message")
    if isinstance(message, dict):  # Ollama's /api/chat
        return str(message.get("content") or "")
    for field in ("response", "content"):  # Ollama's /api/generate, llama-server's /completion
        value = event.get(field)
        if isinstance(value, str):
            return value
    return ""


def _usage(event: dict[str, Any]) -> Any:
    for holder in (event, event.get("message"), event.get("response")):
        if isinstance(holder, dict) and isinstance(holder.get("usage"), dict):
            return holder["usage"]
    if "eval_count" in event:  # Ollama's last line
        return {k: event[k] for k in ("prompt_eval_count", "eval_count") if k in event}
    return None
