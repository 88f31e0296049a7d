"""The one error map: one status for one condition, in the OpenAI error shape."""

from __future__ import annotations

import json

import pytest

from rocmforge_supervisor._errors import (
    Forbidden,
    ForgeError,
    ModelFailed,
    ModelNotFound,
    PayloadTooLarge,
    QueueFull,
    ServerUnavailable,
    StreamError,
    Unauthorized,
    UsageError,
)
from rocmforge_supervisor.service.edge._errors_http import (
    UpstreamModel,
    error_response,
    sse_error_chunk,
    status_for,
    upstream_error,
)


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
        (ModelFailed("failed for good", kind="file_not_found"), 500, "file_not_found"),
    ],
)
def test_status_for_each_condition(exc: ForgeError, status: int, code: str | None) -> None:
    got_status, _, got_code = status_for(exc)
    assert (got_status, got_code) == (status, code)


def test_a_failed_model_is_not_retried() -> None:
    """Not a 503 ("in a moment"): a 500 whose header the official SDKs obey before the status."""
    r = error_response(ModelFailed("model 'm' failed: no model file at /x.gguf", kind="file_not_found"))
    assert r.status_code == 500 and r.headers["x-should-retry"] == "false"
    assert "retry-after" not in r.headers


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


def _llama(status: int, message: str, err_type: str, **extra: object) -> bytes:
    """An error body as llama-server (4df29be, format_error_response) writes it."""
    return json.dumps({"error": {"code": status, "message": message, "type": err_type, **extra}}).encode()


TINY = UpstreamModel("tiny", ctx_size=4096, parallel=4)


@pytest.mark.parametrize(
    ("status", "message", "err_type", "want_status", "hint_has"),
    [
        (500, "tools param requires --jinja flag", "server_error", 400, "without tools"),
        (500, "tool_choice param requires --jinja flag", "server_error", 400, "jinja"),
        (500, "Failed to parse messages: Missing 'role' in message", "server_error", 400, "fix the request"),
        (500, 'Failed to parse tools: Missing tool function: {"type":"function"}', "server_error", 400, "fix"),
        (500, 'Failed to parse tools: Expected \'tools\' to be an array, got "x"', "server_error", 400, "fix"),
        (500, "[json.exception.out_of_range.406] number overflow parsing '1e400'", "server_error", 400, "fix"),
        (500, "image input is not supported - hint: …", "server_error", 400, "mmproj = \"auto\""),
        (500, "Cannot use both json_schema and grammar", "server_error", 400, "fix"),
        (501, "This server does not support embeddings. Start it with `--embeddings`", "not_supported_error", 400,
         "embeddings = true"),
        (400, "Pooling type 'none' is not OAI compatible. Please use a different pooling type",
         "invalid_request_error", 400, "embeddings = true"),
        (501, "This server does not support reranking. Start it with `--reranking`", "not_supported_error", 400,
         "--reranking"),
        (400, "Expected 'messages' to be an array", "invalid_request_error", 400, None),
        (503, "Loading model", "unavailable_error", 503, "retry"),
        (500, "got exception: bad_alloc", "server_error", 500, "forge logs tiny"),
        (401, "Invalid API Key", "authentication_error", 502, None),
    ],
)  # fmt: skip
def test_upstream_errors_client_faults_are_4xx(
    status: int, message: str, err_type: str, want_status: int, hint_has: str | None
) -> None:
    exc = upstream_error(TINY, status, _llama(status, message, err_type))
    got, _, _ = status_for(exc)
    assert got == want_status
    assert "'tiny'" in str(exc)
    if hint_has:
        assert exc.hint and hint_has in exc.hint


def test_context_error_names_the_per_slot_arithmetic() -> None:
    body = _llama(
        400,
        "request (1500 tokens) exceeds the available context size (1024 tokens), try increasing it",
        "exceed_context_size_error",
        n_prompt_tokens=1500,
        n_ctx=1024,
    )
    exc = upstream_error(TINY, 400, body)
    assert status_for(exc)[:2] == (400, "invalid_request_error")
    assert "per slot: ctx_size 4096 / parallel 4 = 1024" in str(exc)
    assert "raise ctx_size or lower parallel" in str(exc)


def test_a_non_json_upstream_error_keeps_its_text() -> None:
    exc = upstream_error(TINY, 500, b"Internal Server Error")
    assert status_for(exc)[0] == 500 and "Internal Server Error" in str(exc)


def test_a_field_error_names_its_param_in_the_openai_shape() -> None:
    from rocmforge_supervisor._errors import InvalidRequest

    r = error_response(InvalidRequest("field 'seed' is out of range", param="seed"))
    assert json.loads(bytes(r.body))["error"]["param"] == "seed"
    assert json.loads(bytes(error_response(UsageError("bad"), dialect="ollama").body)) == {"error": "bad"}
