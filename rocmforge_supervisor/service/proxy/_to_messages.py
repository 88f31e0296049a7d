"""OpenAI chat → Anthropic's Messages request, for an upstream that speaks only Anthropic's
Messages API (the request half of :mod:`._openai_upstream`, which translates the answer back).

``system`` and ``developer`` messages become the top-level ``system`` (joined, in order:
Anthropic has no system turn mid-conversation); user and assistant text (a string or text parts)
become text blocks, ``image_url`` parts image blocks (a ``data:`` URL → a base64 source, an
http(s) URL → a url source), a PDF ``file`` part a document block; an assistant's ``tool_calls``
become ``tool_use`` blocks (their arguments parsed), ``role: "tool"`` messages ``tool_result``
blocks of a user turn. Anthropic's turns alternate, so consecutive messages of one role (a run of
tool results, the user's text after them) are merged into one turn, its tool results first.
``tools`` (function tools) → ``{name, description, input_schema}``; ``tool_choice``
auto/none/required/a function → auto/none/any/tool, ``parallel_tool_calls: false`` →
``disable_parallel_tool_use``; ``max_completion_tokens`` (else ``max_tokens``, else
:data:`DEFAULT_MAX_TOKENS`: Anthropic requires one) → ``max_tokens``; ``stop`` → ``stop_sequences``;
``user`` → ``metadata.user_id``; ``model``, ``temperature``, ``top_p``, ``stream`` as given, and
Anthropic's own ``top_k`` and ``thinking`` (an OpenAI client's ``extra_body``) too.

OpenAI's fields that Anthropic lacks are decided one by one: refused with a 400 where the client
would get something else than it asked for (``n`` > 1: one choice only; a JSON
``response_format``; audio; a web search; the deprecated ``functions``), dropped where the
answer is still the one asked for (``stream_options``, ``logprobs``, ``top_logprobs``, ``seed``,
the penalties, ``logit_bias``, ``store``, ``metadata``, ``service_tier``, ``reasoning_effort``
…). A field none of those lists names (a server's own, sent in ``extra_body``) is dropped too:
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ..._errors import InvalidRequest

__all__ = ["DEFAULT_MAX_TOKENS", "messages_body"]

#: ``max_tokens`` when the OpenAI request sets none (OpenAI's is optional, Anthropic's required).
DEFAULT_MAX_TOKENS = 4096

#: Anthropic's own request fields an OpenAI client may send (``extra_body``): passed as they are.
_NATIVE = ("top_k", "thinking")

#: OpenAI's fields that have an Anthropic counterpart: translated.
_TRANSLATED = frozenset(
    {
        "model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p",
        "stop", "stream", "tools", "tool_choice", "parallel_tool_calls", "user",
    }
)  # fmt: skip

#: OpenAI's fields Anthropic cannot honour, that the client would miss: a 400 when they ask for
#: anything but the default (one choice, a text answer).
_REFUSED = frozenset(
    {"n", "response_format", "modalities", "audio", "functions", "function_call", "web_search_options"}
)

#: OpenAI's fields with no counterpart that leave the answer what was asked for: dropped.
_DROPPED = frozenset(
    {
        "stream_options", "logprobs", "top_logprobs", "seed", "frequency_penalty",
        "presence_penalty", "logit_bias", "store", "metadata", "service_tier", "prediction",
        "reasoning_effort", "verbosity", "prompt_cache_key", "prompt_cache_options",
        "prompt_cache_retention", "safety_identifier", "moderation",
    }
)  # fmt: skip

#: Anthropic's image types (its ``Base64ImageSource.media_type``).
_IMAGE_TYPES = frozenset({"image/jpeg", "image/png", "image/gif", "image/webp"})

# -- the request ---------------------------------------------------------------------------------


def _bad(where: str, what: str) -> InvalidRequest:
    return InvalidRequest(f"field {where!r} {what}", param=where, hint=f"fix {where!r}")


def _refuse(where: str, what: str, hint: str) -> InvalidRequest:
    return InvalidRequest(
        f"field {where!r} {what}: this model's upstream speaks only Anthropic's Messages API",
        param=where,
        hint=hint,
    )


def _parts(content: Any, where: str) -> list[Mapping[str, Any]]:
    """``content`` as a list of parts (a string is one text part, null none)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if content is None:
        return []
    if not isinstance(content, list):
        raise _bad(where, "must be a string or an array of content parts")
    for j, part in enumerate(content):
        if not isinstance(part, Mapping) or not isinstance(part.get("type"), str):
            raise _bad(f"{where}[{j}]", 'must be a content part (an object with a "type")')
    return content


def _text_blocks(content: Any, where: str) -> list[dict[str, Any]]:
    """Text parts (and an assistant's refusal) as text blocks; Anthropic refuses an empty one."""
    blocks = []
    for j, part in enumerate(_parts(content, where)):
        if part["type"] not in ("text", "refusal"):
            raise _bad(f"{where}[{j}]", "must be a text part")
        text = part.get("text") if part["type"] == "text" else part.get("refusal")
        if not isinstance(text, str):
            raise _bad(f"{where}[{j}]", "must have a string text")
        if text:
            blocks.append({"type": "text", "text": text})
    return blocks


def _data_url(url: str, where: str) -> tuple[str, str]:
    """A ``data:`` URL's media type and its base64 data."""
    head, comma, data = url.partition(",")
    params = head[len("data:") :].split(";")
    if not comma or "base64" not in params[1:] or not data:
        raise _bad(where, "must be a base64 data: URL (data:<media type>;base64,<data>)")
    return params[0].strip().lower(), data


def _image_block(part: Mapping[str, Any], where: str) -> dict[str, Any]:
    image = part.get("image_url")
    url = image.get("url") if isinstance(image, Mapping) else image
    where = f"{where}.image_url.url"
    if not isinstance(url, str):
        raise _bad(where, "must be a string")
    if url.startswith("data:"):
        media, data = _data_url(url, where)
        media = "image/jpeg" if media == "image/jpg" else media
        if media not in _IMAGE_TYPES:
            raise _refuse(
                where,
                f"is an image of type {media!r}",
                "send a JPEG, PNG, GIF or WebP image (the types Anthropic takes)",
            )
        return {"type": "image", "source": {"type": "base64", "media_type": media, "data": data}}
    if url.startswith(("https://", "http://")):
        return {"type": "image", "source": {"type": "url", "url": url}}
    raise _bad(where, "must be a data: URL or an http(s) URL")


def _document_block(part: Mapping[str, Any], where: str) -> dict[str, Any]:
    file = part.get("file")
    if not isinstance(file, Mapping):
        raise _bad(f"{where}.file", "must be an object")
    data = file.get("file_data")
    if not isinstance(data, str):
        raise _refuse(
            f"{where}.file",
            "names an OpenAI file (file_id), which Anthropic cannot read",
            "send the file's content as file_data (a base64 data: URL)",
        )
    if data.startswith("data:"):
        media, data = _data_url(data, f"{where}.file.file_data")
    else:
        media = "application/pdf"  # bare base64, as OpenAI's own clients send a PDF
    if media != "application/pdf":
        raise _refuse(f"{where}.file.file_data", f"is a file of type {media!r}", "send a PDF, or its text")
    block: dict[str, Any] = {
        "type": "document",
        "source": {"type": "base64", "media_type": "application/pdf", "data": data},
    }
    if isinstance(file.get("filename"), str) and file["filename"]:
        block["title"] = file["filename"]
    return block


def _user_blocks(content: Any, where: str) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    for j, part in enumerate(_parts(content, where)):
        here = f"{where}[{j}]"
        kind = part["type"]
        if kind == "text":
            if not isinstance(part.get("text"), str):
                raise _bad(here, "must have a string text")
            if part["text"]:
                blocks.append({"type": "text", "text": part["text"]})
        elif kind == "image_url":
            blocks.append(_image_block(part, here))
        elif kind == "file":
            blocks.append(_document_block(part, here))
        elif kind == "input_audio":
            raise _refuse(here, "is audio, which Anthropic's Messages API does not take", "send text")
        else:
            raise _bad(here, f"has an unknown type {kind!r}")
    return blocks


def _arguments(text: Any, where: str) -> dict[str, Any]:
    if isinstance(text, Mapping):
        return dict(text)
    if text is None or (isinstance(text, str) and not text.strip()):
        return {}
    if not isinstance(text, str):
        raise _bad(where, "must be a string of JSON")
    try:
        parsed = json.loads(text)
    except ValueError:
        raise _bad(where, "is not valid JSON (Anthropic takes a tool call's input as an object)") from None
    if not isinstance(parsed, dict):
        raise _bad(where, "must be a JSON object (Anthropic takes a tool call's input as an object)")
    return parsed


def _assistant_blocks(message: Mapping[str, Any], where: str) -> list[dict[str, Any]]:
    if message.get("function_call") is not None:
        raise _refuse(f"{where}.function_call", "is the deprecated function call", "send it as tool_calls")
    blocks = _text_blocks(message.get("content"), f"{where}.content")
    calls = message.get("tool_calls") or []
    if not isinstance(calls, list):
        raise _bad(f"{where}.tool_calls", "must be an array")
    for j, call in enumerate(calls):
        here = f"{where}.tool_calls[{j}]"
        fn = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
            raise _bad(here, 'must be an object with a "function" that has a "name"')
        if call.get("type", "function") != "function":
            raise _refuse(f"{here}.type", f"is {call['type']!r}", "send function tool calls only")
        if not isinstance(call.get("id"), str) or not call["id"]:
            raise _bad(f"{here}.id", "must be a string (its tool message names it)")
        blocks.append(
            {
                "type": "tool_use",
                "id": call["id"],
                "name": fn["name"],
                "input": _arguments(fn.get("arguments"), f"{here}.function.arguments"),
            }
        )
    return blocks


def _tool_result(message: Mapping[str, Any], where: str) -> dict[str, Any]:
    call = message.get("tool_call_id")
    if not isinstance(call, str) or not call:
        raise _bad(f"{where}.tool_call_id", "must be a string")
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": call}
    content = message.get("content")
    if isinstance(content, str):
        if content:
            block["content"] = content
    else:
        texts = _text_blocks(content, f"{where}.content")
        if texts:
            block["content"] = texts
    return block


def _turns(messages: Any) -> tuple[list[str], list[dict[str, Any]]]:
    """The system texts, and the user/assistant turns (alternating: consecutive ones merged)."""
    if not isinstance(messages, list):
        raise _bad("messages", "must be an array")
    system: list[str] = []
    turns: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str):
            raise _bad(where, 'must be an object with a "role"')
        role = m["role"]
        if role in ("system", "developer"):
            system += [b["text"] for b in _text_blocks(m.get("content"), f"{where}.content")]
            continue
        if role == "user":
            blocks = _user_blocks(m.get("content"), f"{where}.content")
        elif role == "assistant":
            blocks = _assistant_blocks(m, where)
        elif role == "tool":
            role, blocks = "user", [_tool_result(m, where)]
        elif role == "function":
            raise _refuse(f"{where}.role", "is the deprecated 'function'", "send a 'tool' message")
        else:
            raise _bad(f"{where}.role", f"has an unknown role {role!r}")
        if not blocks:
            continue  # an empty message: Anthropic refuses it, and it says nothing
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"] += blocks
        else:
            turns.append({"role": role, "content": blocks})
    for turn in turns:  # a user turn's tool results first: they answer the turn before
        if turn["role"] == "user":
            turn["content"].sort(key=lambda b: b["type"] != "tool_result")
    if not turns:
        raise _bad("messages", "must hold a user or assistant message (Anthropic needs one)")
    return system, turns


def _tools(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise _bad("tools", "must be an array")
    out = []
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, Mapping):
            raise _bad(where, "must be an object")
        if tool.get("type", "function") != "function":
            raise _refuse(f"{where}.type", f"is {tool['type']!r}", "define function tools only")
        fn = tool.get("function")
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
            raise _bad(f"{where}.function", 'must be an object with a "name"')
        schema = fn.get("parameters") or {"type": "object", "properties": {}}
        if not isinstance(schema, Mapping):
            raise _bad(f"{where}.function.parameters", "must be a JSON schema object")
        converted: dict[str, Any] = {"name": fn["name"], "input_schema": dict(schema)}
        if isinstance(fn.get("description"), str) and fn["description"]:
            converted["description"] = fn["description"]
        if fn.get("strict") is True:
            converted["strict"] = True
        out.append(converted)
    return out


def _tool_choice(choice: Any, parallel: Any) -> dict[str, Any] | None:
    out: dict[str, Any] | None
    if choice is None:
        out = {"type": "auto"} if parallel is False else None
    elif choice in ("auto", "none"):
        out = {"type": choice}
    elif choice == "required":
        out = {"type": "any"}
    elif (
        isinstance(choice, Mapping)
        and choice.get("type") == "function"
        and isinstance(choice.get("function"), Mapping)
        and isinstance(choice["function"].get("name"), str)
    ):
        out = {"type": "tool", "name": choice["function"]["name"]}
    else:
        raise _bad(
            "tool_choice",
            'must be "auto", "none", "required" or {"type": "function", "function": {"name": …}}',
        )
    if out is not None and parallel is False and out["type"] != "none":
        out["disable_parallel_tool_use"] = True
    return out


def _max_tokens(payload: Mapping[str, Any]) -> int:
    for field in ("max_completion_tokens", "max_tokens"):
        value = payload.get(field)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise _bad(field, "must be a positive integer")
        return value
    return DEFAULT_MAX_TOKENS


def _stop(stop: Any) -> list[str]:
    if isinstance(stop, str):
        return [stop] if stop else []
    if isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        return [s for s in stop if s]
    raise _bad("stop", "must be a string or an array of strings")


def _refuse_fields(payload: Mapping[str, Any]) -> None:
    """OpenAI's fields Anthropic has no way to honour, that the client would miss: a 400 each."""
    n = payload.get("n")
    if n is not None and n != 1:
        raise _refuse("n", f"asks for {n} choices; Anthropic returns one choice", "send n = 1, or none")
    fmt = payload.get("response_format")
    if fmt is not None and not (isinstance(fmt, Mapping) and fmt.get("type") == "text"):
        raise _refuse(
            "response_format",
            "asks for a JSON answer, which Anthropic's Messages API has no field for",
            "describe the JSON in the prompt, or define a tool whose input is that schema",
        )
    modalities = payload.get("modalities")
    if isinstance(modalities, list) and "audio" in modalities:
        raise _refuse("modalities", "asks for an audio answer", "ask for text only")
    if payload.get("audio") is not None:
        raise _refuse("audio", "asks for an audio answer", "ask for text only")
    for field in ("functions", "function_call"):
        if payload.get(field) is not None:
            raise _refuse(field, "is OpenAI's deprecated function calling", "send tools and tool_choice")
    if payload.get("web_search_options") is not None:
        raise _refuse(
            "web_search_options", "asks for a web search", "send the request without web_search_options"
        )


def messages_body(payload: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI chat completion request (already checked) as an Anthropic Messages request."""
    _refuse_fields(payload)
    system, turns = _turns(payload.get("messages"))
    body: dict[str, Any] = {}
    if "model" in payload:
        body["model"] = payload["model"]
    body["max_tokens"] = _max_tokens(payload)
    if system:
        body["system"] = "\n".join(system)
    body["messages"] = turns
    for field in ("temperature", "top_p", *_NATIVE):
        if payload.get(field) is not None:
            body[field] = payload[field]
    if payload.get("stop") is not None and (stops := _stop(payload["stop"])):
        body["stop_sequences"] = stops
    if isinstance(payload.get("stream"), bool):
        body["stream"] = payload["stream"]
    if payload.get("tools"):
        body["tools"] = _tools(payload["tools"])
        choice = _tool_choice(payload.get("tool_choice"), payload.get("parallel_tool_calls"))
        if choice is not None:
            body["tool_choice"] = choice
    elif payload.get("tool_choice") not in (None, "auto", "none"):
        raise _bad("tool_choice", "asks for a tool, but the request defines no tools")
    user = payload.get("user")
    if isinstance(user, str) and user:
        body["metadata"] = {"user_id": user}
    return body
