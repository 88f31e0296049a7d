"""OpenAI's Files and Batches API: ``/v1/files`` and ``/v1/batches``, in OpenAI's shapes.

Upload a JSONL of requests (``purpose = "batch"``), create a batch over it for one endpoint
(``/v1/chat/completions``, ``/v1/completions`` or ``/v1/embeddings``) and a ``completion_window``
(``24h``), then read ``output_file_id`` / ``error_file_id`` through ``/v1/files/{id}/content``.
The records and bodies are the ``batches`` package's; the lines are sent by its runner through
this service's own request path (:func:`asgi_sender`), in the ``background`` class.

Who sees what: a file or batch belongs to the key that made it (its *name*); another key gets a
404 for it, as for an id that does not exist; an admin key sees every one. Limits:
``server.batch_max_bytes`` per uploaded file, ``server.batch_max_lines`` per batch.
"""

from __future__ import annotations

import json
from typing import Any

import anyio
import httpx
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp

from ..._errors import ForgeError, InvalidRequest, PayloadTooLarge, RequestRejected
from ...access import PRIORITY_HEADER, Key
from ...batches import ENDPOINTS, WINDOWS, BatchStore, Send, parse_input
from ..core._recording import request_key
from ..core._state import GatewayState, body_limit, read_body, request_id, state_of
from ..edge._errors_http import error_response
from ._upload import read_upload

__all__ = ["asgi_sender", "routes"]


def routes() -> list[BaseRoute]:
    return [
        Route("/v1/files", _guard(_create_file), methods=["POST"]),
        Route("/v1/files", _guard(_list_files), methods=["GET"]),
        Route("/v1/files/{file_id}", _guard(_get_file), methods=["GET"]),
        Route("/v1/files/{file_id}", _guard(_delete_file), methods=["DELETE"]),
        Route("/v1/files/{file_id}/content", _guard(_file_content), methods=["GET"]),
        Route("/v1/batches", _guard(_create_batch), methods=["POST"]),
        Route("/v1/batches", _guard(_list_batches), methods=["GET"]),
        Route("/v1/batches/{batch_id}", _guard(_get_batch), methods=["GET"]),
        Route("/v1/batches/{batch_id}/cancel", _guard(_cancel_batch), methods=["POST"]),
    ]


def _guard(fn: Any) -> Any:
    """The route's errors, rendered in the one place; 503 when the service keeps no batches."""

    async def endpoint(request: Request) -> Response:
        try:
            st = state_of(request)
            if st.batches is None:
                raise RequestRejected(
                    "this service keeps no batches (its state dir could not hold them)",
                    status_code=503,
                    hint="see the service log",
                )
            result: Response = await fn(request, st, st.batches)
            return result
        except ForgeError as exc:
            return error_response(exc, request_id(request))

    endpoint.__name__ = fn.__name__.lstrip("_")
    endpoint.__doc__ = fn.__doc__  # the OpenAPI document's summary
    return endpoint


def _owner(request: Request) -> tuple[str | None, bool]:
    """(the key's name, whether it sees every record: an admin, or a service without keys)."""
    key: Key | None = request_key(request.scope)
    return (key.name, key.admin) if key is not None else (None, True)


def _not_found(what: str, ident: str) -> RequestRejected:
    """404 for an id that does not exist and for another key's alike (existence is not told)."""
    listing = "batches" if what == "batch" else "files"
    return RequestRejected(
        f"no {what} {ident!r}",
        status_code=404,
        error_type="not_found_error",
        hint=f"list them with GET /v1/{listing}",
    )


def _visible(owner: str | None, every: bool, record_owner: str | None) -> bool:
    return every or owner == record_owner


# -- files -------------------------------------------------------------------------------------


async def _create_file(request: Request, st: GatewayState, store: BatchStore) -> Response:
    """summary: upload a batch input file (multipart: file, purpose=batch)"""
    body = await read_body(request, body_limit(st, "/v1/files"))
    limit = st.server.batch_max_bytes
    upload = await read_upload(
        request,
        body,
        limit,
        fields=("purpose",),
        default_name="input.jsonl",
        missing="",
        hint="send the JSONL as the multipart field `file`",
        max_part_size=limit + 1,
    )
    data, filename, purpose = upload.data, upload.filename, upload.fields["purpose"]
    if purpose != "batch":
        raise InvalidRequest(
            f"purpose {purpose!r} is not supported: this service keeps files for batches only",
            param="purpose",
            hint='send purpose = "batch"',
        )
    if len(data) > limit:
        raise PayloadTooLarge(
            f"file: the file is over {limit} bytes",
            param="file",
            hint="split it (server.batch_max_bytes sets the limit)",
        )
    owner, _ = _owner(request)
    made = await anyio.to_thread.run_sync(
        lambda: store.add_file(data, filename=filename, purpose="batch", owner=owner)
    )
    return JSONResponse(made)


async def _list_files(request: Request, st: GatewayState, store: BatchStore) -> Response:
    """summary: the key's files, newest first (?purpose=&limit=&after=&order=asc|desc)"""
    owner, every = _owner(request)
    purpose = request.query_params.get("purpose")
    data = await anyio.to_thread.run_sync(lambda: store.files(owner, every=every, purpose=purpose))
    order = request.query_params.get("order", "desc")
    if order not in ("asc", "desc"):
        raise InvalidRequest(
            f"order must be asc or desc, not {order!r}", param="order", hint="send asc or desc"
        )
    if order == "asc":
        data.reverse()
    return _page(request, data, default=10000, most=10000)


async def _file(request: Request, store: BatchStore) -> str:
    """The path's file id, once it is known to be the caller's (else a 404)."""
    fid = request.path_params["file_id"]
    exists, record_owner = await anyio.to_thread.run_sync(store.file_owner, fid)
    owner, every = _owner(request)
    if not exists or not _visible(owner, every, record_owner):
        raise _not_found("file", fid)
    return str(fid)


async def _get_file(request: Request, st: GatewayState, store: BatchStore) -> Response:
    """summary: one file's record"""
    fid = await _file(request, store)
    return JSONResponse(await anyio.to_thread.run_sync(store.file, fid))


async def _file_content(request: Request, st: GatewayState, store: BatchStore) -> Response:
    """summary: a file's bytes (a batch's input, output or error JSONL)"""
    fid = await _file(request, store)
    data = await anyio.to_thread.run_sync(store.content, fid)
    return Response(data, media_type="application/octet-stream")


async def _delete_file(request: Request, st: GatewayState, store: BatchStore) -> Response:
    """summary: delete a file"""
    fid = await _file(request, store)
    await anyio.to_thread.run_sync(store.delete_file, fid)
    return JSONResponse({"id": fid, "object": "file", "deleted": True})


# -- batches -----------------------------------------------------------------------------------


async def _create_batch(request: Request, st: GatewayState, store: BatchStore) -> Response:
    """summary: create a batch over an uploaded file (endpoint, completion_window)"""
    raw = await read_body(request, st.server.max_body_bytes)
    try:
        payload = json.loads(raw or b"{}")
    except ValueError as exc:
        raise InvalidRequest(f"the body is not JSON: {exc}", hint="send a JSON object") from None
    if not isinstance(payload, dict):
        raise InvalidRequest("the body must be a JSON object", hint="send a JSON object")
    endpoint = payload.get("endpoint")
    if endpoint not in ENDPOINTS:
        raise InvalidRequest(
            f"endpoint {endpoint!r} is not one a batch can call",
            param="endpoint",
            hint=f"use one of {', '.join(ENDPOINTS)}",
        )
    window = payload.get("completion_window", "24h")
    if window not in WINDOWS:
        raise InvalidRequest(
            f"completion_window {window!r} is not supported", param="completion_window", hint='use "24h"'
        )
    metadata = payload.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise InvalidRequest("metadata must be an object", param="metadata", hint="send key-value strings")
    fid = payload.get("input_file_id")
    if not isinstance(fid, str):
        raise InvalidRequest(
            'the body has no "input_file_id"', param="input_file_id", hint="upload with POST /v1/files"
        )
    exists, record_owner = await anyio.to_thread.run_sync(store.file_owner, fid)
    owner, every = _owner(request)
    if not exists or not _visible(owner, every, record_owner):
        raise _not_found("file", fid)
    data = await anyio.to_thread.run_sync(store.content, fid)
    lines, errors = parse_input(data, str(endpoint), st.server.batch_max_lines)
    made = await anyio.to_thread.run_sync(
        lambda: store.create_batch(
            owner=owner,
            input_file_id=fid,
            endpoint=str(endpoint),
            window=str(window),
            metadata=metadata,
            lines=lines,
            errors=errors,
        )
    )
    if st.batch_runner is not None:
        st.batch_runner.poke()
    return JSONResponse(made)


async def _batch(request: Request, store: BatchStore) -> dict[str, Any]:
    bid = request.path_params["batch_id"]
    found = await anyio.to_thread.run_sync(store.batch, bid)
    owner, every = _owner(request)
    if found is None or not _visible(owner, every, found[1]):
        raise _not_found("batch", bid)
    return found[0]


async def _list_batches(request: Request, st: GatewayState, store: BatchStore) -> Response:
    """summary: the key's batches, newest first (?limit=&after=)"""
    owner, every = _owner(request)
    data = await anyio.to_thread.run_sync(lambda: store.batches(owner, every=every))
    return _page(request, data, default=20, most=100)


def _page(request: Request, data: list[dict[str, Any]], *, default: int, most: int) -> Response:
    """One page of a list as OpenAI's list endpoints give it: the items after ``?after=ID``
    (none when that id is not in the list), at most ``?limit=`` of them (1 to ``most``)."""
    after = request.query_params.get("after")
    if after:
        ids = [item["id"] for item in data]
        data = data[ids.index(after) + 1 :] if after in ids else []
    raw = request.query_params.get("limit", str(default))
    try:
        limit = int(raw)
    except ValueError:
        raise InvalidRequest(
            f"limit must be a number, not {raw!r}", param="limit", hint=f"send 1 to {most}"
        ) from None
    if not 1 <= limit <= most:
        raise InvalidRequest(
            f"limit must be 1 to {most}, not {limit}", param="limit", hint=f"send 1 to {most}"
        )
    page = data[:limit]
    return JSONResponse(
        {
            "object": "list",
            "data": page,
            "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None,
            "has_more": len(data) > limit,
        }
    )


async def _get_batch(request: Request, st: GatewayState, store: BatchStore) -> Response:
    """summary: one batch: status, request_counts, output_file_id, error_file_id"""
    return JSONResponse(await _batch(request, store))


async def _cancel_batch(request: Request, st: GatewayState, store: BatchStore) -> Response:
    """summary: cancel a batch (cancelling, then cancelled with what was done)"""
    data = await _batch(request, store)
    if data["status"] in ("validating", "in_progress", "finalizing"):
        data = await anyio.to_thread.run_sync(store.cancel, data["id"])
        if st.batch_runner is not None:
            st.batch_runner.poke()
    elif data["status"] not in ("cancelling", "cancelled"):
        raise RequestRejected(
            f"batch {data['id']!r} is {data['status']}: it cannot be cancelled",
            status_code=409,
            hint="only a batch in progress can be cancelled",
        )
    return JSONResponse(data)


# -- the runner's way in -----------------------------------------------------------------------


def asgi_sender(app: ASGIApp, st: GatewayState) -> tuple[Send, httpx.AsyncClient]:
    """The runner's ``send``: one request into ``app`` in process (its middleware — the key,
    its limits, the activity record and charge — and the forwarder), as the batch's owner's key,
    with ``X-Priority: background``. Returns the client too, for the service to close."""
    client = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app, client=("127.0.0.1", 0)),
        base_url="http://forge-batch",
        timeout=None,
    )

    async def send(owner: str | None, endpoint: str, body: bytes, rid: str) -> tuple[int, bytes]:
        headers = {"content-type": "application/json", PRIORITY_HEADER: "background", "x-request-id": rid}
        keys = st.recorder.keys
        if keys:
            key = next((k for k in keys.keys if k.name == owner), None)
            if key is None:
                error = {
                    "error": {
                        "message": f"the API key {owner!r} that created this batch is no longer configured",
                        "type": "authentication_error",
                        "code": "key_removed",
                    }
                }
                return 401, json.dumps(error).encode()
            headers["authorization"] = "Bearer " + key.secret.decode()
        response = await client.post(endpoint, content=body, headers=headers)
        return response.status_code, response.content

    return send, client
