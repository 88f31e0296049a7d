"""The one place where typed errors become HTTP statuses and OpenAI-shaped error bodies."""

from __future__ import annotations

import json

from starlette.responses import JSONResponse

from .._errors import (
    ConfigError,
    ForgeError,
    InstanceError,
    ModelNotFound,
    PlacementError,
    QueueFull,
    RequestRejected,
    ServerUnavailable,
    ServiceError,
    UsageError,
)

__all__ = ["error_body", "error_response", "sse_error_chunk", "status_for"]


def status_for(exc: ForgeError) -> tuple[int, str, str | None]:
    """(HTTP status, OpenAI error type, OpenAI error code) for a typed error."""
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
    return 502, "server_error", None


def error_body(message: str, err_type: str, code: str | int | None = None) -> dict[str, object]:
    return {"error": {"message": message, "type": err_type, "param": None, "code": code}}


def error_response(exc: ForgeError, request_id: str | None = None) -> JSONResponse:
    status, err_type, code = status_for(exc)
    headers = {}
    if isinstance(exc, QueueFull):
        headers["Retry-After"] = str(max(1, round(exc.retry_after)))
    if request_id:
        headers["X-Request-ID"] = request_id
    return JSONResponse(error_body(str(exc), err_type, code), status_code=status, headers=headers)


def sse_error_chunk(message: str, err_type: str = "server_error", code: int = 502) -> bytes:
    """Once a stream has started, an error can only be a chunk: the same shape llama-server sends."""
    payload = {"error": {"code": code, "message": message, "type": err_type}}
    return b"data: " + json.dumps(payload).encode() + b"\n\n"
