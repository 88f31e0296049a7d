"""The one map from typed errors to HTTP: status, the OpenAI-shaped body, and the SSE error chunk.

Every error at the edge — the middleware's (auth, Origin, body size), the routes', the
supervisor's and the upstream transport's — arrives here as a :class:`ForgeError`; nothing else in
``service/`` picks a status. One condition, one status: a body over the limit is 413 whether its
``Content-Length`` said so or it was counted while read.
"""

from __future__ import annotations

import json

from starlette.responses import JSONResponse

from .._errors import (
    ConfigError,
    Forbidden,
    ForgeError,
    InstanceError,
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

__all__ = ["error_body", "error_response", "sse_error_chunk", "status_for"]


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
    if isinstance(exc, InstanceError):
        return 503, "unavailable_error", exc.reason
    if isinstance(exc, (ServiceError, ServerUnavailable)):
        return 503, "unavailable_error", None
    if isinstance(exc, StreamError):
        return 502, "server_error", "upstream_broken"
    return 502, "server_error", None


def error_body(message: str, err_type: str, code: str | int | None = None) -> dict[str, object]:
    return {"error": {"message": message, "type": err_type, "param": None, "code": code}}


def error_response(exc: ForgeError, request_id: str | None = None) -> JSONResponse:
    status, err_type, code = status_for(exc)
    headers = {}
    if isinstance(exc, QueueFull):
        headers["Retry-After"] = str(max(1, round(exc.retry_after)))
    if isinstance(exc, Unauthorized):
        headers["WWW-Authenticate"] = "Bearer"
    if request_id:
        headers["X-Request-ID"] = request_id
    return JSONResponse(error_body(str(exc), err_type, code), status_code=status, headers=headers)


def sse_error_chunk(exc: ForgeError) -> bytes:
    """Once a stream has started, an error can only be a chunk: the shape llama-server sends."""
    status, err_type, _ = status_for(exc)
    payload = {"error": {"code": status, "message": str(exc), "type": err_type}}
    return b"data: " + json.dumps(payload).encode() + b"\n\n"
