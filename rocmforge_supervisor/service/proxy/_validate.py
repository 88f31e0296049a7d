"""What the gateway checks of a request body before forwarding it: JSON that Python and
llama-server both read, and the types of the fields it knows — each failure a 400 naming the field.

llama-server answers many type errors itself, but some of them as 500 (``Missing 'role'``, a
number past float64) and a body nested a thousand levels deep broke the gateway's own parse
(``RecursionError``). Fields this table does not know pass through untouched: llama-server has
many extensions and the gateway should not have to learn each.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..._errors import InvalidRequest
from ..core._names import LENGTHS, length_field, sends_length

__all__ = [
    "CHECKS",
    "LENGTH_FIELDS",
    "BodyShape",
    "check_fields",
    "default_length",
    "has_parts",
    "parse_object",
    "require_length",
]

_INT64 = (-(2**63), 2**63 - 1)
_INT32 = (-(2**31), 2**31 - 1)


class _NotJson(ValueError):
    pass


def _finite(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise _NotJson(f"the number {text[:40]} is out of range (past a 64-bit float)")
    return value


def _no_constant(text: str) -> float:
    raise _NotJson(f"{text} is not JSON (send a number, or null)")


#: Built once: ``json.loads`` with hooks would build a decoder per request.
_DECODER = json.JSONDecoder(parse_float=_finite, parse_constant=_no_constant)


def parse_object(body: bytes, *, what: str = "the request body") -> dict[str, Any]:
    """The body as a JSON object; any failure (syntax, depth, range, shape) is one 400."""
    try:
        payload = _DECODER.decode(body.decode("utf-8"))
    except RecursionError:
        raise InvalidRequest(
            f"{what} is nested too deeply", hint="send JSON nested fewer than 500 levels"
        ) from None
    except _NotJson as exc:
        raise InvalidRequest(f"{what}: {exc}", hint="send valid JSON") from None
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
        raise InvalidRequest(f"{what} is not valid JSON ({exc})", hint="send a JSON object") from None
    if not isinstance(payload, dict):
        raise InvalidRequest(f"{what} must be a JSON object, not {_kind(payload)}", hint="send {...}")
    return payload


# -- field checks ---------------------------------------------------------------------------------

#: A check takes (value, field path) and raises InvalidRequest naming the path.
Check = Callable[[Any, str], None]


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def _wrong(path: str, expected: str, value: Any) -> InvalidRequest:
    return InvalidRequest(
        f"field {path!r} must be {expected}, not {_kind(value)}", param=path, hint=f"fix {path!r}"
    )


def _integer(low: int, high: int) -> Check:
    def check(value: Any, path: str) -> None:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _wrong(path, "an integer", value)
        if not low <= value <= high:
            raise InvalidRequest(
                f"field {path!r} is {value}, out of range ({low} to {high})", param=path, hint=f"fix {path!r}"
            )

    return check


def _number(value: Any, path: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _wrong(path, "a number", value)
    if isinstance(value, int) and not _INT64[0] <= value <= _INT64[1]:
        raise InvalidRequest(f"field {path!r} is out of range", param=path, hint=f"fix {path!r}")


def _of(expected: str, *types: type) -> Check:
    def check(value: Any, path: str) -> None:
        if isinstance(value, bool) and bool not in types:
            raise _wrong(path, expected, value)
        if not isinstance(value, types):
            raise _wrong(path, expected, value)

    return check


_bool = _of("a boolean", bool)
_str = _of("a string", str)
_obj = _of("an object", dict)
_list = _of("an array", list)
_str_or_list = _of("a string or an array", str, list)
_str_or_obj = _of("a string or an object", str, dict)


def _stop(value: Any, path: str) -> None:
    _str_or_list(value, path)
    if isinstance(value, list):
        for i, item in enumerate(value):
            _str(item, f"{path}[{i}]")


def _messages(value: Any, path: str) -> None:
    _list(value, path)
    for i, msg in enumerate(value):
        where = f"{path}[{i}]"
        _obj(msg, where)
        if "role" not in msg:
            raise InvalidRequest(
                f"field {where!r} has no 'role'", param=f"{where}.role", hint="give each message a role"
            )
        _str(msg["role"], f"{where}.role")
        content = msg.get("content")
        if content is not None:
            _str_or_list(content, f"{where}.content")
            if isinstance(content, list):
                for j, part in enumerate(content):
                    _obj(part, f"{where}.content[{j}]")
                    _str(part.get("type"), f"{where}.content[{j}].type")
        if msg.get("tool_calls") is not None:
            _list(msg["tool_calls"], f"{where}.tool_calls")


_SAMPLING: dict[str, Check] = {
    "model": _str,
    "stream": _bool,
    "max_tokens": _integer(-1, _INT32[1]),
    "n_predict": _integer(-1, _INT32[1]),
    "n": _integer(1, 128),
    "seed": _integer(*_INT64),
    "top_k": _integer(*_INT32),
    "temperature": _number,
    "top_p": _number,
    "min_p": _number,
    "presence_penalty": _number,
    "frequency_penalty": _number,
    "repeat_penalty": _number,
    "stop": _stop,
    "logprobs": _bool,
    "top_logprobs": _integer(0, 100),
    "logit_bias": _obj,
    "stream_options": _obj,
    "user": _str,
}

#: Field checks per route, by the route table's ``checks`` column (``core/_routes.FORWARDED``).
CHECKS: dict[str, dict[str, Check]] = {
    "chat": {
        **_SAMPLING,
        "messages": _messages,
        "max_completion_tokens": _integer(-1, _INT32[1]),
        "tools": _list,
        "tool_choice": _str_or_obj,
        "response_format": _obj,
        "parallel_tool_calls": _bool,
    },
    "completion": {**_SAMPLING, "prompt": _str_or_list, "echo": _bool, "suffix": _str},
    # Anthropic's Messages API (its max_tokens is required: see require_length)
    "messages": {
        "model": _str,
        "stream": _bool,
        "max_tokens": _integer(1, _INT32[1]),
        "messages": _list,
        "system": _str_or_list,
        "stop_sequences": _stop,
        "temperature": _number,
        "top_p": _number,
        "top_k": _integer(*_INT32),
    },
    "embedding": {
        "model": _str,
        "input": _str_or_list,
        "encoding_format": _str,
        "dimensions": _integer(1, _INT32[1]),
        "user": _str,
    },
}


@dataclass(frozen=True)
class BodyShape:
    """What a checked body holds that decides which model checks it meets: a plain text chat
    (most requests) meets neither the tools check nor the media check, and their modules are not
    entered for it."""

    tools: bool
    """A non-empty ``tools`` list (``_tools`` decides whether it asks for them)."""
    parts: bool
    """A message or ``input`` item whose content is a list of parts: where images and audio are
    (``_media``); a string content holds none."""


def has_parts(payload: dict[str, Any]) -> bool:
    """Whether a message or ``input`` item has a list of parts as its content (where media is)."""
    for field in ("messages", "input"):
        items = payload.get(field)
        if isinstance(items, list):
            for item in items:
                if isinstance(item, dict) and isinstance(item.get("content"), list):
                    return True
    return False


def check_fields(payload: dict[str, Any], kind: str) -> BodyShape:
    """Raise InvalidRequest for the first known field of the wrong type (null means "unset");
    the body's :class:`BodyShape` when all are right."""
    checks = CHECKS.get(kind, {})
    for key, value in payload.items():
        check = checks.get(key)
        if check is not None and value is not None:
            check(value, key)
    tools = payload.get("tools")
    return BodyShape(tools=isinstance(tools, list) and bool(tools), parts=has_parts(payload))


#: The fields that bound an answer's length, in every request shape llama-server reads.
LENGTH_FIELDS = LENGTHS


def default_length(
    payload: dict[str, Any], default: int | None, *, field: str = "max_tokens", path: str | None = None
) -> bool:
    """A model's ``max_tokens`` (forge.toml) set as ``field`` in a request that bounds its answer
    by none of :data:`LENGTH_FIELDS`: the one rule for every route and dialect. With ``path`` (an
    upstream route), in that route's own field and only where it generates text, when the body
    has none of the fields the route reads. Whether it set it."""
    if path is not None:
        route_field = length_field(path)
        if default is None or route_field is None or sends_length(payload, path):
            return False
        payload[route_field] = default
        return True
    if default is None or any(payload.get(k) is not None for k in LENGTH_FIELDS):
        return False
    payload[field] = default
    return True


#: Routes whose API requires a length, and the field: Anthropic's Messages API refuses a request
#: without ``max_tokens`` (llama-server would run it to 4096 tokens or the end of the context).
_REQUIRED_LENGTH = {"/v1/messages": "max_tokens"}


def require_length(payload: dict[str, Any], path: str) -> None:
    """A 400 in the API's own words when route ``path`` requires a length and the body, after a
    variant's rules and the model's default, still has none."""
    field = _REQUIRED_LENGTH.get(path)
    if field is not None and payload.get(field) is None:
        raise InvalidRequest(
            f"{field}: Field required",
            param=field,
            hint=f'send "{field}", the most tokens the answer may have (e.g. 1024): the Messages API requires it',
        )
