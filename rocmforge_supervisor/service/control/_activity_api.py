"""``GET /api/activity``, ``GET /api/activity/{id}`` and ``GET /api/usage``: the activity log, read.

Reads run on a worker thread, after the store's writer has committed what was queued before
(a client that just got its answer finds its row). A key that is not an admin sees only its own
key's rows, of the models it may see (``core._visibility``), and never captured bodies; an admin
key (or a service without keys) sees everything.
"""

from __future__ import annotations

import re
import sqlite3
import time
from datetime import datetime
from typing import Any

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from ..._errors import ForgeError, InvalidRequest, KeyForbidden, ModelNotFound, ServiceError
from ...activity import USAGE_GROUPS, ActivityStore
from ..core._recording import request_key
from ..core._state import request_id, state_of
from ..core._visibility import model_scope
from ..edge._errors_http import error_response

__all__ = ["parse_since", "routes"]

_SINCE = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def routes() -> list[BaseRoute]:
    return [
        Route("/api/activity", api_activity, methods=["GET"]),
        Route("/api/activity/{ident:int}", api_activity_row, methods=["GET"]),
        Route("/api/usage", api_usage, methods=["GET"]),
    ]


def parse_since(text: str, now: float) -> float:
    """``24h``, ``7d``, ``30m``, ``90s``, an ISO date or time, or Unix seconds → Unix time."""
    found = _SINCE.match(text.strip())
    if found:
        return now - float(found.group(1)) * _UNITS[found.group(2)]
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        raise InvalidRequest(
            f"since={text!r} is not a time",
            param="since",
            hint="use 24h, 7d, 30m, an ISO date, or Unix seconds",
        ) from None


def _store(request: Request) -> ActivityStore:
    store = state_of(request).recorder.store
    if store is None:
        raise ServiceError(
            "the activity log is off",
            hint="set activity = true in [server] (the default) and reload (forge reload or SIGHUP)",
        )
    return store


async def _read(store: ActivityStore, what: Any) -> Any:
    def run() -> Any:
        store.flush(2.0)
        try:
            return what()
        except sqlite3.Error as exc:
            raise ServiceError(
                store.problem or f"the activity log {store.path} cannot be read: {exc}",
                hint="run `forge doctor` for the fix",
            ) from exc

    return await anyio.to_thread.run_sync(run)


def _int_param(request: Request, name: str, default: int | None, lo: int, hi: int) -> int | None:
    text = request.query_params.get(name)
    if text is None or text == "":
        return default
    try:
        value = int(text)
    except ValueError:
        value = lo - 1
    if not lo <= value <= hi:
        raise InvalidRequest(f"{name}={text!r} is not a number from {lo} to {hi}", param=name)
    return value


def _own_rows_only(request: Request) -> str | None:
    """The key name a non-admin key is limited to (None: sees every row)."""
    key = request_key(request.scope)
    return key.name if key is not None and not key.admin else None


async def api_activity(request: Request) -> Response:
    """
    summary: The activity log, newest first (no bodies); filter by model, key, status.
    description: A key that is not an admin gets its own rows, of the models it may use (asking
      for another model is a 403).
    parameters:
      - {name: model, in: query, schema: {type: string}}
      - {name: key, in: query, description: an API key's name, schema: {type: string}}
      - {name: status, in: query, schema: {type: integer}}
      - {name: limit, in: query, schema: {type: integer, default: 100}}
      - {name: after, in: query, description: only rows with a greater id (to follow), schema: {type: integer}}
    responses:
      200: {description: '{"activity": [{id, started, route, model, key, status, prompt_tokens, …}]}'}
      503: {description: the log is off or cannot be read}
    """
    try:
        store = _store(request)
        q = request.query_params
        own = _own_rows_only(request)
        key = q.get("key") or None
        if own is not None:
            key = own
        seen = model_scope(request.scope, state_of(request).supervisor)
        model = q.get("model") or None
        if model is not None:
            seen.check(model)  # a model outside a scoped key's models: the model routes' 403
        rows = await _read(
            store,
            lambda: store.rows(
                model=model,
                key=key,
                status=_int_param(request, "status", None, 100, 599),
                after=_int_param(request, "after", None, 0, 2**62),
                limit=_int_param(request, "limit", 100, 1, 10000) or 100,
            ),
        )
    except ForgeError as exc:
        return error_response(exc, request_id(request))
    return JSONResponse({"activity": [r for r in rows if r["model"] is None or seen.sees(r["model"])]})


async def api_activity_row(request: Request) -> Response:
    """
    summary: One request of the activity log, with its captured request and response bodies.
    responses:
      200: {description: '{id, …, request_body, response_body}'}
      403: {description: "a key that is not an admin asked for captured bodies, another key's row, or a
        row of a model it may not use"}
      404: {description: no such row (kept rows are bounded by age and count)}
    """
    ident = int(request.path_params["ident"])
    try:
        store = _store(request)
        row = await _read(store, lambda: store.row(ident))
        if row is None:
            raise ModelNotFound(
                f"no activity row {ident}",
                hint="rows are kept for activity_keep_days, at most activity_max_rows",
            )
        key = request_key(request.scope)
        if key is not None and not key.admin:
            if row["key"] != key.name:
                key.check_admin(f"read activity row {ident} of another key")
            if row["model"] is not None:
                model_scope(request.scope, state_of(request).supervisor).check(row["model"])
            if row["request_body"] is not None or row["response_body"] is not None:
                raise KeyForbidden(
                    f"the API key {key.name!r} may not read captured bodies: they need an admin key",
                    code="admin_required",
                    hint="use an admin key, or GET /api/activity for the row without its bodies",
                )
    except ForgeError as exc:
        return error_response(exc, request_id(request))
    return JSONResponse(row)


async def api_usage(request: Request) -> Response:
    """
    summary: Requests and tokens per API key name or per model, since a time.
    parameters:
      - {name: by, in: query, schema: {type: string, enum: [key, model], default: key}}
      - {name: since, in: query, description: '24h, 7d, an ISO date, or Unix seconds (default 24h)', schema: {type: string}}
    responses:
      200: {description: '{"by", "since", "usage": [{key|model, requests, prompt_tokens, completion_tokens, total_tokens, errors}]}'}
    """
    try:
        store = _store(request)
        by = request.query_params.get("by", "key")
        if by not in USAGE_GROUPS:
            raise InvalidRequest(f"by={by!r} is not one of {', '.join(USAGE_GROUPS)}", param="by")
        since = parse_since(request.query_params.get("since", "24h"), time.time())
        rows = await _read(store, lambda: store.usage(by, since))
        own = _own_rows_only(request)
        if own is not None:
            if by != "key":
                raise KeyForbidden(
                    f"the API key {own!r} may see only its own usage: ?by=model needs an admin key",
                    code="admin_required",
                    hint="ask with ?by=key, or use an admin key",
                )
            rows = [r for r in rows if r["key"] == own]
    except ForgeError as exc:
        return error_response(exc, request_id(request))
    return JSONResponse({"by": by, "since": since, "usage": rows})
