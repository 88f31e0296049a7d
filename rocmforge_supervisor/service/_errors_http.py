"""The one map from typed errors to HTTP: status, the error body, and the SSE error chunk.

Every error at the edge — the middleware's (auth, Origin, body size), the routes', the
supervisor's and the upstream transport's — arrives here as a :class:`ForgeError`; nothing else in
``service/`` picks a status. One condition, one status: a body over the limit is 413 whether its
``Content-Length`` said so or it was counted while read.

The body's *shape* follows the route's API dialect (:data:`~._routes.Dialect`): OpenAI's
``{"error":{message,type,…}}``, Anthropic's ``{"type":"error","error":{type,message}}`` (the
anthropic SDK reads ``error.type``), or Ollama's ``{"error":"message"}`` (the ollama client reads a
string). The status, type and code come from :func:`status_for` whatever the shape.
"""

from __future__ import annotations

import json

from starlette.responses import JSONResponse

from .._errors import (
    ConfigError,
    Forbidden,
    ForgeError,
    InstanceError,
    ModelLoading,
    ModelNotFound,
    PayloadTooLarge,
    PlacementError,
    QueueFull,
    RequestRejected,
    ServerUnavailable,
    ServiceError,
    StreamError,
    Unauthorized,
    UsageError,
)
from ._routes import Dialect

__all__ = ["error_body", "error_response", "shape_error", "sse_error_chunk", "status_for"]

#: HTTP status → Anthropic's error type (docs.anthropic.com "Errors").
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def status_for(exc: ForgeError) -> tuple[int, str, str | None]:
    """(HTTP status, OpenAI error type, OpenAI error code) for a typed error."""
    if isinstance(exc, Unauthorized):
        return 401, "authentication_error", "invalid_api_key"
    if isinstance(exc, Forbidden):
        return 403, "permission_error", "forbidden_origin"
    if isinstance(exc, PayloadTooLarge):
        return 413, "invalid_request_error", "request_too_large"
    if isinstance(exc, ModelNotFound):
        return 404, "invalid_request_error", "model_not_found"
    if isinstance(exc, QueueFull):
        return 429, "rate_limit_error", "queue_full"
    if isinstance(exc, ConfigError):
        return 400, "invalid_request_error", "invalid_config"
    if isinstance(exc, UsageError):
        return 400, "invalid_request_error", None
    if isinstance(exc, RequestRejected):
        return exc.status_code or 400, exc.error_type or "invalid_request_error", None
    if isinstance(exc, PlacementError):
        return 503, "insufficient_resources", "does_not_fit"
    if isinstance(exc, ModelLoading):
        return 503, "unavailable_error", "model_loading"
    if isinstance(exc, InstanceError):
        return 503, "unavailable_error", exc.reason
    if isinstance(exc, (ServiceError, ServerUnavailable)):
        return 503, "unavailable_error", None
    if isinstance(exc, StreamError):
        return 502, "server_error", "upstream_broken"
    return 502, "server_error", None


def error_body(message: str, err_type: str, code: str | int | None = None) -> dict[str, object]:
    return {"error": {"message": message, "type": err_type, "param": None, "code": code}}


def shape_error(
    dialect: Dialect, status: int, message: str, err_type: str, code: str | int | None = None
) -> dict[str, object]:
    """The error body a client of ``dialect`` parses, from the one map's (status, type, code)."""
    if dialect == "anthropic":
        return {
            "type": "error",
            "error": {"type": _ANTHROPIC_TYPES.get(status, "api_error"), "message": message},
        }
    if dialect == "ollama":
        return {"error": message}
    return error_body(message, err_type, code)


def error_response(
    exc: ForgeError, request_id: str | None = None, dialect: Dialect = "openai"
) -> JSONResponse:
    status, err_type, code = status_for(exc)
    headers = {}
    body = shape_error(dialect, status, str(exc), err_type, code)
    if isinstance(exc, QueueFull):
        headers["Retry-After"] = str(max(1, round(exc.retry_after)))
    if isinstance(exc, ModelLoading):
        headers["Retry-After"] = str(max(1, round(exc.retry_after)))
        body["loading"] = exc.loading
    if isinstance(exc, Unauthorized):
        headers["WWW-Authenticate"] = "Bearer"
    if request_id:
        headers["X-Request-ID"] = request_id
    return JSONResponse(body, status_code=status, headers=headers)


def sse_error_chunk(exc: ForgeError, dialect: Dialect = "openai") -> bytes:
    """Once a stream has started, an error can only be an event: the shape llama-server sends —
    ``data: {"error":…}`` for OpenAI routes, ``event: error`` + Anthropic's body for /v1/messages."""
    status, err_type, _ = status_for(exc)
    if dialect == "anthropic":
        body = shape_error("anthropic", status, str(exc), err_type)
        return b"event: error\ndata: " + json.dumps(body).encode() + b"\n\n"
    payload = {"error": {"code": status, "message": str(exc), "type": err_type}}
    return b"data: " + json.dumps(payload).encode() + b"\n\n"
