"""The gateway app: one OpenAI-compatible endpoint for all models, plus the control API.

It never spawns or stops processes: it asks the supervisor (acquire / load / unload / reload).
The jobs live in their own modules — ``_middleware`` (request id, auth, Origin, body size),
``_proxy`` (the forwarded model routes), ``_control`` (``/api/*``), ``ollama`` (the Ollama
API, also under ``/api/*``: the two sets of paths do not meet; the one place the core imports
that package), ``_listing`` (the model facts both APIs list), ``_observe`` (health, ready,
metrics) — and every error becomes HTTP in one place, ``_errors_http``. A module that serves
routes exposes ``routes()``; :func:`create_app` lists them (more can be passed as ``extra_routes``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from functools import partial

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from .._errors import RequestRejected, ServerError
from . import ollama
from .control import _activity_api, _observe, _openapi, _page, _status_api
from .control import _api as _control
from .core._recording import note_status
from .core._routes import dialect_for_path
from .core._state import GatewayState, request_id
from .edge._errors_http import error_response
from .edge._middleware import LiveCors, RequestContext
from .proxy import _batch_api
from .proxy import _forward as _proxy
from .proxy._listing import ModelFacts
from .proxy._model_card import local_model_path
from .proxy._relay import CLIENT_GONE

__all__ = ["GatewayState", "create_app"]


def create_app(
    state: GatewayState,
    *,
    extra_routes: Sequence[BaseRoute] = (),
) -> Starlette:
    facts = ModelFacts(
        state.supervisor,
        state.upstream,
        resolve_path=partial(local_model_path, settings=state.settings),
    )
    ollama_api = ollama.OllamaBackend(facts)
    routes: list[BaseRoute] = [
        *_observe.routes(),
        *_proxy.routes(),
        *_control.routes(),
        *ollama.routes(ollama_api),
        *_openapi.routes(),
        *_batch_api.routes(),  # /v1/files and /v1/batches
        *extra_routes,
    ]
    routes += [
        *_status_api.routes(),
        *_activity_api.routes(),
        *_page.routes(),
    ]  # the status page at / and its data
    # CORS outermost, so that a preflight is answered before auth (browsers send no key on it).
    middleware = [
        Middleware(LiveCors, state=state),
        Middleware(RequestContext, state=state, public_paths=_page.PAGE_PATHS),
    ]
    handlers = {HTTPException: _http_error, ClientDisconnect: _client_gone, Exception: _internal_error}
    app = Starlette(routes=routes, middleware=middleware, exception_handlers=handlers)
    app.state.gateway = state
    # The model facts (``_listing``), which ``_proxy`` reads for ``/v1/models`` and the tools check
    # under the attribute's old name: it is not Ollama's (that API gets them through its backend).
    app.state.ollama = facts
    return app


async def _http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own 404/405 (no route, wrong method), as JSON in the dialect of the path."""
    assert isinstance(exc, HTTPException)
    hint: str | None
    if exc.status_code == 404:
        message = f"no route {request.method} {request.url.path}"
        hint = "see /api/openapi.json for the routes"
    else:
        message = f"{request.method} is not allowed on {request.url.path}"
        hint = f"use {exc.headers.get('Allow', 'another method')}" if exc.headers else None
    kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
    error = RequestRejected(message, hint=hint, status_code=exc.status_code, error_type=kind)
    return error_response(
        error, request_id(request), dialect_for_path(request.url.path), headers=dict(exc.headers or {})
    )


async def _client_gone(request: Request, exc: Exception) -> Response:
    """A client that left while it was still sending its body: nothing to answer and no fault of
    the service's (not an internal error, no traceback); its activity row says it left (499)."""
    logging.getLogger("rocmforge.gateway").info(
        "request %s: the client left while sending its body (%s)", request_id(request), request.url.path
    )
    note_status(CLIENT_GONE, "client_gone")
    return Response(status_code=CLIENT_GONE)


async def _internal_error(request: Request, exc: Exception) -> Response:
    """A bug: logged with its traceback (by Starlette, after this), answered as JSON, not text."""
    logging.getLogger("rocmforge.gateway").error("internal error on %s: %r", request.url.path, exc)
    error = ServerError(f"internal error: {type(exc).__name__}", hint="see the service log", status_code=500)
    return error_response(error, request_id(request), dialect_for_path(request.url.path))
