"""The one map from typed errors to HTTP: status, the error body, and the SSE error chunk.

Every error at the edge — the middleware's (auth, Origin, body size), the routes', the
supervisor's, the upstream transport's, and llama-server's own error answers (through
:func:`upstream_error`: client faults 4xx with a forge hint, 5xx only when the server failed) —
arrives here as a :class:`ForgeError`; nothing else in ``service/`` picks a status. One
condition, one status: a body over the limit is 413 whether its
``Content-Length`` said so or it was counted while read.

The body's *shape* follows the route's API dialect (:data:`~._routes.Dialect`): OpenAI's
``{"error":{message,type,…}}``, Anthropic's ``{"type":"error","error":{type,message}}`` (the
anthropic SDK reads ``error.type``), or Ollama's ``{"error":"message"}`` (the ollama client reads a
string). The status, type and code come from :func:`status_for` whatever the shape.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from starlette.responses import JSONResponse

from ..._errors import (
    ConfigError,
    ContextExceeded,
    Forbidden,
    ForgeError,
    InstanceError,
    KeyForbidden,
    ModelFailed,
    ModelLoading,
    ModelNotFound,
    PayloadTooLarge,
    PlacementError,
    QueueFull,
    RateLimited,
    RequestRejected,
    ResidencyConflict,
    ServerError,
    ServerUnavailable,
    ServiceError,
    StreamError,
    Unauthorized,
    UnsupportedMediaType,
    UsageError,
)
from ..core import _recording
from ..core._routes import Dialect
from ..core._visibility import redacted

__all__ = [
    "UpstreamModel",
    "error_body",
    "error_response",
    "shape_error",
    "sse_error_chunk",
    "status_for",
    "upstream_error",
]

#: HTTP status → Anthropic's error type (docs.anthropic.com "Errors").
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "invalid_request_error",
    413: "request_too_large",
    415: "invalid_request_error",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


_Status = tuple[int, str, str | None]

#: (HTTP status, OpenAI error type, OpenAI error code) by error class, tried in this order (a
#: subclass before its base); the last three from the error itself where it carries them.
_STATUS: tuple[
    tuple[type[BaseException] | tuple[type[BaseException], ...], Callable[[Any], _Status]], ...
] = (
    (Unauthorized, lambda e: (401, "authentication_error", "invalid_api_key")),
    (KeyForbidden, lambda e: (403, "permission_error", e.code)),
    (Forbidden, lambda e: (403, "permission_error", "forbidden_origin")),
    (RateLimited, lambda e: (429, "rate_limit_error", "rate_limited")),
    (PayloadTooLarge, lambda e: (413, "invalid_request_error", "request_too_large")),
    (UnsupportedMediaType, lambda e: (415, "invalid_request_error", "unsupported_media_type")),
    (ModelNotFound, lambda e: (404, "invalid_request_error", "model_not_found")),
    (QueueFull, lambda e: (429, "rate_limit_error", "queue_full")),
    (ConfigError, lambda e: (400, "invalid_request_error", "invalid_config")),
    (UsageError, lambda e: (400, "invalid_request_error", None)),
    (ContextExceeded, lambda e: (400, "invalid_request_error", "context_length_exceeded")),
    (RequestRejected, lambda e: (e.status_code or 400, e.error_type or "invalid_request_error", None)),
    # Failed for good (the breaker stays open until `forge load NAME` or a reload): no 503, which
    # says "in a moment" and which every SDK retries. The server failed, not the request, so a
    # 5xx (and in the 5xx alerts), with X-Should-Retry: false (error_response).
    (ModelFailed, lambda e: (500, "server_error", e.kind or "model_failed")),
    # A rule forbids the load (pinned, swap = never, a group): waiting will not change it.
    (ResidencyConflict, lambda e: (409, "invalid_request_error", "residency_conflict")),
    (PlacementError, lambda e: (503, "insufficient_resources", "does_not_fit")),
    (ModelLoading, lambda e: (503, "unavailable_error", "model_loading")),
    (InstanceError, lambda e: (503, "unavailable_error", e.reason)),
    ((ServiceError, ServerUnavailable), lambda e: (503, "unavailable_error", None)),
    (StreamError, lambda e: (502, "server_error", "upstream_broken")),
    (ServerError, lambda e: (e.status_code or 500, "server_error", None)),
)


def status_for(exc: ForgeError) -> _Status:
    """(HTTP status, OpenAI error type, OpenAI error code) for a typed error."""
    for cls, answer in _STATUS:
        if isinstance(exc, cls):
            return answer(exc)
    return 502, "server_error", None


def error_body(
    message: str, err_type: str, code: str | int | None = None, param: str | None = None
) -> dict[str, object]:
    return {"error": {"message": message, "type": err_type, "param": param, "code": code}}


def shape_error(
    dialect: Dialect,
    status: int,
    message: str,
    err_type: str,
    code: str | int | None = None,
    param: str | None = None,
) -> dict[str, object]:
    """The error body a client of ``dialect`` parses, from the one map's (status, type, code)."""
    if dialect == "anthropic":
        return {
            "type": "error",
            "error": {"type": _ANTHROPIC_TYPES.get(status, "api_error"), "message": message},
        }
    if dialect == "ollama":
        return {"error": message}
    return error_body(message, err_type, code, param)


def error_response(
    exc: ForgeError,
    request_id: str | None = None,
    dialect: Dialect = "openai",
    *,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    status, err_type, code = status_for(exc)
    _recording.note_error(type(exc).__name__)
    headers = dict(headers or {})
    body = shape_error(dialect, status, _message(exc), err_type, code, getattr(exc, "param", None))
    if isinstance(exc, QueueFull | RateLimited):
        headers["Retry-After"] = str(max(1, round(exc.retry_after)))
    if isinstance(exc, ModelLoading):
        headers["Retry-After"] = str(max(1, round(exc.retry_after)))
        body["loading"] = exc.loading
    if isinstance(exc, ServerUnavailable):  # its child went away: a restart takes seconds
        headers["Retry-After"] = "2"
    if isinstance(exc, Unauthorized):
        headers["WWW-Authenticate"] = "Bearer"
    if isinstance(exc, ModelFailed | ResidencyConflict):
        # The official SDKs (openai, anthropic; Python and JS) obey this before the status: a
        # permanent failure is not retried (with their defaults, 3 tries and ~2 s of backoff).
        headers["X-Should-Retry"] = "false"
    if request_id:
        headers["X-Request-ID"] = request_id
    return JSONResponse(body, status_code=status, headers=headers)


def _message(exc: ForgeError) -> str:
    """The error's line as the request's key may read it: a key scoped to some models is not
    told the others' names (a 404's "known models", a placement's holders). A 403 for its model
    keeps the name the request sent itself."""
    return str(exc) if isinstance(exc, KeyForbidden) else redacted(str(exc))


def sse_error_chunk(exc: ForgeError, dialect: Dialect = "openai") -> bytes:
    """Once a stream has started, an error can only be an event: the shape llama-server sends —
    ``data: {"error":…}`` for OpenAI routes, ``event: error`` + Anthropic's body for /v1/messages."""
    status, err_type, _ = status_for(exc)
    message = _message(exc)
    if dialect == "ollama":  # an NDJSON stream: its error is a line of its own, as Ollama's
        return json.dumps({"error": message}, separators=(",", ":")).encode() + b"\n"
    if dialect == "anthropic":
        body = shape_error("anthropic", status, message, err_type)
        return b"event: error\ndata: " + json.dumps(body).encode() + b"\n\n"
    payload = {"error": {"code": status, "message": message, "type": err_type}}
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


# -- llama-server's own error answers ---------------------------------------------------------------


@dataclass(frozen=True)
class UpstreamModel:
    """What the error map needs to know of the model that answered: its name and slot geometry."""

    name: str
    ctx_size: int | None = None
    parallel: int | None = None
    kv_unified: bool = False
    """Its slots share one KV cache: one request may use all of ``ctx_size``."""


_NO_TEMPLATE_HINT = (
    "model {name!r} runs without a jinja chat template (its GGUF has none, so forge starts it with "
    "--no-jinja): send the request without tools, or serve a GGUF with a tool-capable template"
)
_NO_MMPROJ_HINT = (
    "model {name!r} has no multimodal projector for this input: send text only, or set "
    'mmproj = "auto" (or the mmproj .gguf path of a projector that takes it) under [models.{name}]'
)
_FIX_REQUEST = "fix the request (model {name!r})"

#: llama-server answers these with 500 (a C++ runtime_error) or 501, though the request is what
#: is wrong or asks for a feature the model was not started with: read from tools/server/*.cpp
#: at the pinned commit (ex_wrapper turns every non-invalid_argument exception into a 500).
_CLIENT_FAULTS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"tools? param requires --jinja|tool_choice param requires --jinja"), _NO_TEMPLATE_HINT),
    (re.compile(r"(image|audio|video) input is not supported|Multimodal data provided"), _NO_MMPROJ_HINT),
    (
        re.compile(r"does not support embeddings|Pooling type 'none' is not OAI"),
        "set embeddings = true in [models.{name}] (forge then starts it with --embeddings --pooling mean)",
    ),
    (re.compile(r"does not support reranking"), 'add args = ["--reranking"] to [models.{name}]'),
    (re.compile(r"Infill is not supported"), "model {name!r} has no fill-in-the-middle tokens"),
    (
        re.compile(
            r"Failed to parse (messages|tools)|\[json\.exception\.|Cannot use both json_schema and grammar"
            r"|Unsupported param|Only no echo is supported|\"prompt\" (must not be empty|is required)"
            r"|Invalid (uri|base64)|uri must be base64|Failed to (download|load) image|file path is not"
            r"|Failed to tokenize prompt|Invalid input type|must be (a|an) "
        ),
        _FIX_REQUEST,
    ),
)
_CONTEXT_TYPES = ("exceed_context_size_error",)


def upstream_error(model: UpstreamModel, status: int, body: bytes) -> ForgeError:
    """A llama-server error answer (status >= 400) as a typed error: client faults are 4xx with a
    forge hint (SDKs retry 5xx three times), 5xx only when the server itself failed."""
    message, err_type, extra = _read_upstream(body)
    name = model.name
    if err_type in _CONTEXT_TYPES:
        return _context_error(model, message, extra)
    if status == 503:
        return ServerUnavailable(f"model {name!r}: {message}", hint="retry in a moment")
    if status in (401, 403):  # the child's key is forge's business, not the client's
        return ServerError(f"model {name!r} refused forge's own key: {message}", status_code=502)
    for pattern, hint in _CLIENT_FAULTS:
        if pattern.search(message):
            return RequestRejected(f"model {name!r}: {message}", hint=hint.format(name=name), status_code=400)
    if status < 500:
        kind = "not_found_error" if status == 404 else "invalid_request_error"
        return RequestRejected(f"model {name!r}: {message}", status_code=status, error_type=kind)
    if status == 501:  # a feature the child was not started with: not the server failing
        return RequestRejected(f"model {name!r}: {message}", hint=f"check [models.{name}]", status_code=400)
    return ServerError(
        f"model {name!r} failed: {message}", hint=f"see `forge logs {name}`", status_code=status
    )


def _read_upstream(body: bytes) -> tuple[str, str | None, dict[str, object]]:
    try:
        data = json.loads(body)
        err = data["error"]
        return str(err.get("message", "")), err.get("type"), err
    except (ValueError, KeyError, TypeError, AttributeError):
        text = body.decode("utf-8", "replace").strip()[:500]
        return text or "no error message", None, {}


def _context_error(model: UpstreamModel, message: str, extra: dict[str, object]) -> ContextExceeded:
    n_prompt = extra.get("n_prompt_tokens")
    n_ctx = extra.get("n_ctx")
    asked = f"the request ({n_prompt} tokens)" if isinstance(n_prompt, int) else "the request"
    name = model.name
    if model.kv_unified and model.ctx_size:
        # One cache shared by the slots: the request is longer than the whole context.
        return ContextExceeded(
            f"model {name!r}: {asked} does not fit the context (ctx_size {model.ctx_size}, "
            f"shared by its {model.parallel or 1} slots)",
            hint=f"raise ctx_size in [models.{name}], or shorten the prompt",
            n_prompt_tokens=n_prompt if isinstance(n_prompt, int) else None,
            n_ctx=n_ctx if isinstance(n_ctx, int) else None,
        )
    if model.ctx_size and model.parallel:
        per_slot = (
            f"ctx_size {model.ctx_size} / parallel {model.parallel} = {model.ctx_size // model.parallel}"
        )
    elif isinstance(n_ctx, int):
        per_slot = f"{n_ctx} tokens"
    else:
        per_slot = message
    shared = (
        " (or remove its kv_unified = false: one request may then use the whole context)"
        if (model.parallel or 1) > 1
        else ""
    )
    return ContextExceeded(
        f"model {name!r}: {asked} does not fit one slot's context (per slot: {per_slot})",
        hint=f"raise ctx_size or lower parallel in [models.{name}]{shared}, or shorten the prompt",
        n_prompt_tokens=n_prompt if isinstance(n_prompt, int) else None,
        n_ctx=n_ctx if isinstance(n_ctx, int) else None,
    )
