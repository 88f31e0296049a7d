"""The gateway app: one OpenAI-compatible endpoint for all models, plus the control API.

It never spawns or stops processes: it asks the supervisor (acquire / load / unload / reload).
The jobs live in their own modules — ``_middleware`` (request id, auth, Origin, body size),
``_proxy`` (the forwarded model routes), ``_control`` (``/api/*``), ``_ollama`` (the Ollama
API, also under ``/api/*``: the two sets of paths do not meet), ``_observe`` (health, ready,
metrics) — and every error becomes HTTP in one place, ``_errors_http``. A module that serves
routes exposes ``routes()``; :func:`create_app` lists them (more can be passed as ``extra_routes``).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.routing import BaseRoute

from . import _control, _observe, _ollama, _page, _proxy, _status_api
from ._middleware import RequestContext
from ._ollama_meta import local_model_path
from ._state import GatewayState

__all__ = ["GatewayState", "create_app"]


def create_app(
    state: GatewayState,
    *,
    cors_origins: list[str] | None = None,
    extra_routes: Sequence[BaseRoute] = (),
) -> Starlette:
    routes: list[BaseRoute] = [
        *_observe.routes(),
        *_proxy.routes(),
        *_control.routes(),
        *_ollama.routes(),
        *extra_routes,
    ]
    routes += [*_status_api.routes(), *_page.routes()]  # the status page at / and its data
    middleware = [Middleware(RequestContext, state=state)]
    origins = cors_origins if cors_origins is not None else state.cors_origins
    if origins:
        # Outermost, so that a preflight is answered before auth (browsers send no key on it).
        middleware.insert(
            0, Middleware(CORSMiddleware, allow_origins=origins, allow_methods=["*"], allow_headers=["*"])
        )
    app = Starlette(routes=routes, middleware=middleware)
    app.state.gateway = state
    app.state.ollama = _ollama.OllamaBackend(
        state.supervisor,
        forward=partial(_proxy.open_upstream, state),
        resolve_path=partial(local_model_path, settings=state.settings),
    )
    return app
