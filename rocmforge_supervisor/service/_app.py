"""The gateway app: one OpenAI-compatible endpoint for all models, plus the control API.

It never spawns or stops processes: it asks the supervisor (acquire / load / unload / reload).
The jobs live in their own modules — ``_middleware`` (request id, auth, Origin, body size),
``_proxy`` (the forwarded model routes), ``_control`` (``/api/*``), ``_observe`` (health, ready,
metrics) — and every error becomes HTTP in one place, ``_errors_http``. A module that serves
routes exposes ``routes()``; :func:`create_app` lists them (more can be passed as ``extra_routes``).
"""

from __future__ import annotations

from collections.abc import Sequence

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.routing import BaseRoute

from . import _control, _observe, _proxy
from ._middleware import RequestContext
from ._state import GatewayState

__all__ = ["GatewayState", "create_app"]


def create_app(
    state: GatewayState,
    *,
    cors_origins: list[str] | None = None,
    extra_routes: Sequence[BaseRoute] = (),
) -> Starlette:
    routes: list[BaseRoute] = [*_observe.routes(), *_proxy.routes(), *_control.routes(), *extra_routes]
    middleware = [Middleware(RequestContext, state=state)]
    origins = cors_origins if cors_origins is not None else state.cors_origins
    if origins:
        # Outermost, so that a preflight is answered before auth (browsers send no key on it).
        middleware.insert(
            0, Middleware(CORSMiddleware, allow_origins=origins, allow_methods=["*"], allow_headers=["*"])
        )
    app = Starlette(routes=routes, middleware=middleware)
    app.state.gateway = state
    return app
