"""Health (alive), readiness and Prometheus metrics (the gateway's own and each child's)."""

from __future__ import annotations

from collections.abc import Callable

import anyio
import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from ...hardware import refresh_usage
from ...supervisor import ChildEndpoint
from ..core._metrics import DeviceRow
from ..core._pool_metrics import sample_model
from ..core._recording import request_key
from ..core._state import GatewayState, state_of
from ..core._visibility import model_scope

__all__ = ["MetricsPort", "routes"]


def routes() -> list[BaseRoute]:
    return [
        Route("/health", _health, methods=["GET"]),
        Route("/ready", _ready, methods=["GET"]),
        Route("/metrics", _metrics, methods=["GET"]),
    ]


class MetricsPort:
    """Requests that arrived on ``server.metrics_port`` see ``GET /metrics`` alone, without the key;
    any other path there is a 404 (and so is any key-protected data). One uvicorn serves every
    listener; the listener a request came in on is ``scope["server"]``'s port."""

    def __init__(self, app: ASGIApp, state: GatewayState, port: int) -> None:
        self.app = app
        self.port = port
        self._metrics = Starlette(routes=[Route("/metrics", _every_key_metrics, methods=["GET"])])
        self._metrics.state.gateway = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        server = scope.get("server")
        if scope["type"] == "http" and server is not None and server[1] == self.port:
            await self._metrics(scope, receive, send)
            return
        await self.app(scope, receive, send)


async def _health(request: Request) -> Response:
    """Alive: the gateway answers. (Readiness is /ready.)"""
    return JSONResponse({"status": "ok"})


async def _ready(request: Request) -> Response:
    st = state_of(request)
    # The activity log is not worth an outage: a broken one is said here, and the service serves.
    store = st.recorder.store
    details = (
        {"activity": "unavailable: see the service log and `forge doctor`"} if store and store.problem else {}
    )
    if st.supervisor.ready.is_set():
        return JSONResponse({"status": "ready", **details})
    return JSONResponse({"status": "starting", **details}, status_code=503)


async def _metrics(request: Request) -> Response:
    """The exposition; of the per-key families, what the caller may see: an admin key (or a
    service without keys) every key's series, another key its own, and an anonymous caller of a
    keyed service (``metrics_public``) none — other keys' names and usage are not public. A key
    scoped to some models sees only their model-labelled series (the operator's anonymous
    scraper on a public ``/metrics`` sees every model, as it always did)."""
    st = state_of(request)
    key = request_key(request.scope)
    if key is None:  # "": no key is named "" (the schema's pattern)
        return await _exposition(st, "" if st.recorder.keys else None)
    seen = model_scope(request.scope, st.supervisor)
    return await _exposition(st, None if key.admin else key.name, None if seen.everything else seen.sees)


async def _every_key_metrics(request: Request) -> Response:
    """``metrics_port``'s: the operator's scraper, on the listener they chose, sees every key."""
    return await _exposition(state_of(request), None)


async def _exposition(
    st: GatewayState, own: str | None, sees: Callable[[str], bool] | None = None
) -> Response:
    st.metrics.observe_loads(st.supervisor.events.history())
    st.metrics.set_devices(await anyio.to_thread.run_sync(_devices, st))
    st.metrics.child_texts.clear()
    slots: dict[str, object] = {}
    views = st.supervisor.views()
    async with anyio.create_task_group() as tg:
        for v in views:
            # A sleeping child is left alone: its /metrics and /slots would wake it (reload the model).
            if (child := v.answering) is not None:
                tg.start_soon(_scrape, st, v.name, child)
                tg.start_soon(_slots, st, slots, v.name, child)
    st.metrics.set_pool(
        [
            sample_model(
                v.status,
                st.metrics.child_texts.get(v.name),
                slots.get(v.name),
                v.config.args,
                list(v.config.adapters),
            )
            for v in views
        ]
    )
    return Response(
        st.metrics.render(only_key=own, sees=sees), media_type="text/plain; version=0.0.4; charset=utf-8"
    )


async def _slots(st: GatewayState, out: dict[str, object], name: str, child: ChildEndpoint) -> None:
    """One child's ``/slots`` (the KV-cache usage's input); a child that does not answer: none."""
    try:
        r = await st.upstream.get(f"{child.base_url}/slots", headers=child.headers(), timeout=2.0)
        if r.status_code == 200:
            out[name] = r.json()
    except (httpx.HTTPError, ValueError):
        pass


def _devices(st: GatewayState) -> list[DeviceRow]:
    """Device memory re-read now (a few sysfs reads / NVML / psutil), not the placement's copy."""
    if st.supervisor.inventory is None:  # not detected yet (the supervisor is starting)
        return []
    try:
        inventory = refresh_usage(st.supervisor.inventory, st.supervisor.settings)
    except OSError:
        inventory = st.supervisor.inventory
    return [(d.key, d.name, d.vram_total_bytes, d.vram_used_bytes) for d in inventory.devices if d.usable]


async def _scrape(st: GatewayState, name: str, child: ChildEndpoint) -> None:
    """One child's /metrics, relabelled into ours; a child that does not answer is left out."""
    try:
        r = await st.upstream.get(f"{child.base_url}/metrics", headers=child.headers(), timeout=2.0)
        if r.status_code == 200:
            st.metrics.child_texts[name] = r.text
    except httpx.HTTPError:
        st.metrics.child_texts.pop(name, None)
