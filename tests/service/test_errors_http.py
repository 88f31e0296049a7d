"""The one error map: one status for one condition, in the OpenAI error shape."""

from __future__ import annotations

import json

import pytest

from rocmforge_supervisor._errors import (
    Forbidden,
    ForgeError,
    ModelNotFound,
    PayloadTooLarge,
    QueueFull,
    ServerUnavailable,
    StreamError,
    Unauthorized,
    UsageError,
)
from rocmforge_supervisor.service._errors_http import error_response, sse_error_chunk, status_for


@pytest.mark.parametrize(
    ("exc", "status", "code"),
    [
        (Unauthorized("no key"), 401, "invalid_api_key"),
        (Forbidden("other origin"), 403, "forbidden_origin"),
        (PayloadTooLarge("too big"), 413, "request_too_large"),
        (ModelNotFound("no such model"), 404, "model_not_found"),
        (QueueFull("busy"), 429, "queue_full"),
        (UsageError("bad json"), 400, None),
        (ServerUnavailable("down"), 503, None),
        (StreamError("broke"), 502, "upstream_broken"),
    ],
)
def test_status_for_each_condition(exc: ForgeError, status: int, code: str | None) -> None:
    got_status, _, got_code = status_for(exc)
    assert (got_status, got_code) == (status, code)


def test_error_response_headers_and_body() -> None:
    r = error_response(Unauthorized("missing or invalid API key"), "rid-1")
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    assert r.headers["x-request-id"] == "rid-1"
    body = json.loads(bytes(r.body))
    assert body["error"]["type"] == "authentication_error"
    assert (
        json.loads(bytes(error_response(QueueFull("busy", retry_after=2.4)).body))["error"]["code"]
        == "queue_full"
    )
    assert error_response(QueueFull("busy", retry_after=2.4)).headers["retry-after"] == "2"


def test_sse_error_chunk_is_llama_server_shaped() -> None:
    chunk = sse_error_chunk(StreamError("model 'x' stopped mid-stream"))
    assert chunk.startswith(b"data: ") and chunk.endswith(b"\n\n")
    err = json.loads(chunk[len(b"data: ") :])["error"]
    assert err == {"code": 502, "message": "model 'x' stopped mid-stream", "type": "server_error"}
