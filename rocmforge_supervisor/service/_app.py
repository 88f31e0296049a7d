"""The gateway: one OpenAI-compatible endpoint for all models, plus the control API.

It never spawns or stops processes: it asks the supervisor (acquire / load / unload / reload) and
maps typed errors to HTTP in one place (``_errors_http``). Streams are passed through chunk by
chunk (``aiter_raw``), never buffered. The upstream pool expires idle connections after 2 s —
llama-server closes them after 5 s — and a request that failed before any byte came back is sent
once more on a fresh connection, so clients never see a stale keep-alive.
"""

from __future__ import annotations

import hmac
import json
import logging
import re
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anyio
import httpx
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .._errors import ForgeError, ModelNotFound, ServerUnavailable, UsageError
from ..client._textmodel import RETRYABLE
from ..supervisor import Supervisor
from ._errors_http import error_body, error_response, sse_error_chunk
from ._metrics import Metrics

__all__ = ["GatewayState", "create_app"]

log = logging.getLogger("rocmforge.gateway")

_PASS_HEADERS = ("content-type",)
# Probes (a Kubernetes kubelet, a load balancer) cannot send the key; both answer status only.
_PUBLIC_PATHS = frozenset({"/health", "/ready"})
_MODEL_NAME = re.compile(r"[A-Za-z0-9._-]{1,128}")
_LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


class GatewayState:
    """What the routes share: the supervisor, the upstream pool, metrics and the settings."""

    def __init__(
        self,
        supervisor: Supervisor,
        *,
        api_key: str | None,
        max_body_bytes: int,
        model_dirs: list[Path],
        reload: Callable[[], Awaitable[dict[str, Any]]] | None = None,
        cors_origins: list[str] | None = None,
    ) -> None:
        self.cors_origins = list(cors_origins or [])
        self.supervisor = supervisor
        self.api_key = api_key
        self.max_body_bytes = max_body_bytes
        self.model_dirs = [p.resolve() for p in model_dirs]
        self.reload = reload
        self.metrics = Metrics(supervisor.status)
        self.upstream = httpx.AsyncClient(
            timeout=httpx.Timeout(None, connect=5.0),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=512, keepalive_expiry=2.0),
            trust_env=False,
        )


# -- middleware (plain ASGI: no per-request task or body copy) ------------------------------------


class _RequestContext:
    """Request id (``X-Request-ID``, generated when absent), bearer auth, body-size limit."""

    def __init__(self, app: ASGIApp, state: GatewayState) -> None:
        self.app = app
        self.state = state
        self._key = state.api_key.encode() if state.api_key else None

    def _origin_ok(self, origin: bytes) -> bool:
        text = origin.decode("latin-1")
        return text in self.state.cors_origins or urlsplit(text).hostname in _LOOPBACK_HOSTS

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        rid = headers.get(b"x-request-id", b"").decode("latin-1")[:128] or secrets.token_hex(8)
        scope.setdefault("state", {})["request_id"] = rid
        try:
            from ._logging import request_id_var

            request_id_var.set(rid)
        except ImportError:  # pragma: no cover — logging module is optional for the gateway
            pass

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message.setdefault("headers", [])
                message["headers"] = [*message["headers"], (b"x-request-id", rid.encode())]
            await send(message)

        if self._key is not None and scope["path"] not in _PUBLIC_PATHS and scope["method"] != "OPTIONS":
            auth = headers.get(b"authorization", b"")
            token = auth[7:] if auth[:7].lower() == b"bearer " else headers.get(b"x-api-key", b"")
            if not hmac.compare_digest(token, self._key):
                resp = JSONResponse(
                    error_body("missing or invalid API key", "authentication_error", "invalid_api_key"),
                    status_code=401,
                    headers={"WWW-Authenticate": "Bearer"},
                )
                await resp(scope, receive, send_with_id)
                return
        origin = headers.get(b"origin")
        if (
            origin is not None
            and scope["method"] not in ("GET", "HEAD", "OPTIONS")
            and not self._origin_ok(origin)
        ):
            # A web page must not drive the local service (CSRF): browsers send Origin on such
            # requests; tools (curl, SDKs) do not.
            resp = JSONResponse(
                error_body("cross-origin request refused", "permission_error", "forbidden_origin"),
                status_code=403,
            )
            await resp(scope, receive, send_with_id)
            return
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.state.max_body_bytes:
            resp = JSONResponse(
                error_body(f"request body over {self.state.max_body_bytes} bytes", "invalid_request_error"),
                status_code=413,
            )
            await resp(scope, receive, send_with_id)
            return
        await self.app(scope, receive, send_with_id)


def _state(request: Request) -> GatewayState:
    st: GatewayState = request.app.state.gateway
    return st


def _rid(request: Request) -> str | None:
    rid: str | None = request.scope.get("state", {}).get("request_id")
    return rid


async def _read_body(request: Request, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise UsageError(f"request body over {limit} bytes", hint="send a smaller request")
        chunks.append(chunk)
    return b"".join(chunks)


# -- OpenAI-compatible routes --------------------------------------------------------------------


async def _proxy(request: Request) -> Response:
    st = _state(request)
    rid = _rid(request)
    endpoint = request.url.path
    received = time.perf_counter()
    try:
        body = await _read_body(request, st.max_body_bytes)
        try:
            payload = json.loads(body)
        except ValueError:
            raise UsageError("the request body is not valid JSON", hint="send a JSON object") from None
        if not isinstance(payload, dict) or not isinstance(payload.get("model"), str):
            raise UsageError('the request has no "model" field', hint="name one of GET /v1/models")
        name: str = payload["model"]
        stream = bool(payload.get("stream"))
        st.supervisor.get(name)  # 404 before queueing
    except ForgeError as exc:
        st.metrics.errors.labels("-", type(exc).__name__).inc()
        return error_response(exc, rid)

    stack = AsyncExitStack()
    try:
        server = await stack.enter_async_context(st.supervisor.acquire(name))
        upstream = await _send_upstream(st, server, endpoint, body, rid)
    except ForgeError as exc:
        await stack.aclose()
        st.metrics.requests.labels(name, endpoint, "error").inc()
        st.metrics.errors.labels(name, type(exc).__name__).inc()
        return error_response(exc, rid)
    except BaseException:
        with anyio.CancelScope(shield=True):
            await stack.aclose()
        raise

    headers = {k: v for k, v in upstream.headers.items() if k.lower() in _PASS_HEADERS}
    if rid:
        headers["X-Request-ID"] = rid
    if not stream or upstream.status_code != 200:
        try:
            content = await upstream.aread()
        except httpx.HTTPError as exc:
            content = json.dumps(
                error_body(f"model {name!r} failed mid-response: {exc}", "server_error")
            ).encode()
            upstream_status = 502
        else:
            upstream_status = upstream.status_code
        finally:
            await upstream.aclose()
            await stack.aclose()
        st.metrics.ttft.labels(name).observe(time.perf_counter() - received)
        st.metrics.duration.labels(name).observe(time.perf_counter() - received)
        st.metrics.requests.labels(name, endpoint, str(upstream_status)).inc()
        if upstream_status == 200:
            _count_usage(st, name, content)
        return Response(content, status_code=upstream_status, headers=headers)

    async def passthrough() -> AsyncIterator[bytes]:
        first = True
        tail = b""
        status = "200"
        try:
            async for chunk in upstream.aiter_raw():
                if first:
                    st.metrics.ttft.labels(name).observe(time.perf_counter() - received)
                    first = False
                tail = (tail + chunk)[-4096:]
                yield chunk
            if b"[DONE]" not in tail and b'"error"' not in tail:
                raise httpx.RemoteProtocolError("the stream ended without [DONE]")
        except httpx.HTTPError as exc:
            status = "502"
            st.metrics.errors.labels(name, "stream_broken").inc()
            message = f"model {name!r} stopped mid-stream ({exc}); it is being restarted"
            log.warning("request %s: %s", rid, message, extra={"model": name, "request_id": rid})
            yield sse_error_chunk(message)
        finally:
            await release()
            st.metrics.duration.labels(name).observe(time.perf_counter() - received)
            st.metrics.requests.labels(name, endpoint, status).inc()
            _count_usage(st, name, tail)

    released = False

    async def release() -> None:
        """Close the upstream (llama-server stops generating) and give the slot back — once,
        shielded; from the stream's end, or from the response if the stream never started."""
        nonlocal released
        if released:
            return
        released = True
        with anyio.CancelScope(shield=True):
            await upstream.aclose()
            await stack.aclose()

    headers.update({"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    return _ReleasingStream(
        passthrough(), release, status_code=200, headers=headers, media_type="text/event-stream"
    )


class _ReleasingStream(StreamingResponse):
    """A StreamingResponse that runs ``release`` however the response ends — also when the client
    went away before the body iterator ever started (its own ``finally`` then never runs)."""

    def __init__(
        self, content: AsyncIterator[bytes], release: Callable[[], Awaitable[None]], **kw: Any
    ) -> None:
        super().__init__(content, **kw)
        self._release = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._release()


async def _send_upstream(
    st: GatewayState, server: Any, path: str, body: bytes, rid: str | None
) -> httpx.Response:
    headers = {
        "Authorization": f"Bearer {server.api_key}",
        "Content-Type": "application/json",
    }
    if rid:
        headers["X-Request-ID"] = rid
    url = f"{server.base_url}{path}"
    for attempt in (1, 2):
        req = st.upstream.build_request("POST", url, content=body, headers=headers)
        try:
            return await st.upstream.send(req, stream=True)
        except RETRYABLE as exc:
            if attempt == 2 or not server.alive:
                raise ServerUnavailable(
                    f"the model's llama-server did not answer: {exc}", hint="it is being restarted; retry"
                ) from exc
    raise AssertionError("unreachable")


def _count_usage(st: GatewayState, name: str, tail: bytes) -> None:
    """Token counters from the last usage object in the response (cheap: only the tail is read)."""
    i = tail.rfind(b'"usage"')
    if i < 0:
        return
    try:
        start = tail.index(b"{", i)
        usage, _ = json.JSONDecoder().raw_decode(tail[start:].decode("utf-8", "replace"))
    except ValueError:
        return
    if isinstance(usage, dict):
        st.metrics.tokens_in.labels(name).inc(float(usage.get("prompt_tokens", 0) or 0))
        st.metrics.tokens_out.labels(name).inc(float(usage.get("completion_tokens", 0) or 0))


async def _models(request: Request) -> Response:
    st = _state(request)
    data = []
    for s in st.supervisor.status():
        data.append(
            {
                "id": s["name"],
                "object": "model",
                "created": int(st.supervisor.started_at),
                "owned_by": "rocmforge",
                "state": s["state"],
            }
        )
    return JSONResponse({"object": "list", "data": data})


# -- health, readiness, metrics ------------------------------------------------------------------


async def _health(request: Request) -> Response:
    """Alive: the gateway answers. (Readiness is /ready.)"""
    return JSONResponse({"status": "ok"})


async def _ready(request: Request) -> Response:
    st = _state(request)
    if st.supervisor.ready.is_set():
        return JSONResponse({"status": "ready"})
    return JSONResponse({"status": "starting"}, status_code=503)


async def _metrics(request: Request) -> Response:
    st = _state(request)

    async def scrape(name: str, server: Any) -> None:
        try:
            r = await st.upstream.get(
                f"{server.base_url}/metrics",
                headers={"Authorization": f"Bearer {server.api_key}"},
                timeout=2.0,
            )
            if r.status_code == 200:
                st.metrics.child_texts[name] = r.text
        except httpx.HTTPError:
            st.metrics.child_texts.pop(name, None)

    st.metrics.child_texts.clear()
    async with anyio.create_task_group() as tg:
        for m in st.supervisor.models.values():
            if m.server is not None and m.server.alive and m.state == "ready":
                tg.start_soon(scrape, m.name, m.server)
    return Response(st.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")


# -- control API -----------------------------------------------------------------------------------


async def _control(request: Request, action: Callable[[GatewayState], Awaitable[Any]]) -> Response:
    st = _state(request)
    try:
        return JSONResponse(await action(st))
    except ForgeError as exc:
        return error_response(exc, _rid(request))


async def api_models(request: Request) -> Response:
    """
    summary: List the configured models with their state.
    responses:
      200: {description: "[{name, state, pid, port, devices, restarts, last_error, uptime, memory, …}]"}
    """
    return JSONResponse({"models": _state(request).supervisor.status()})


async def api_load(request: Request) -> Response:
    """
    summary: Load a model (and wait until it is ready). Resets a failed model.
    responses:
      200: {description: the model's status}
      404: {description: unknown model}
    """
    name = request.path_params["name"]
    return await _control(request, lambda st: st.supervisor.load(name))


async def api_unload(request: Request) -> Response:
    """
    summary: Drain a model's in-flight requests, then stop its llama-server.
    responses:
      200: {description: the model's status}
    """
    name = request.path_params["name"]
    return await _control(request, lambda st: st.supervisor.unload(name))


async def api_add(request: Request) -> Response:
    """
    summary: Register and load a model by path; only paths under the configured model_dirs.
    requestBody: {description: '{"name": "...", "path": "/models/x.gguf"}'}
    responses:
      200: {description: the model's status}
      400: {description: a path outside model_dirs, or a bad name}
    """

    async def add(st: GatewayState) -> Any:
        try:
            body = json.loads(await _read_body(request, 65536))
            name, path = str(body["name"]), Path(str(body["path"]))
        except (ValueError, KeyError, TypeError):
            raise UsageError('body must be {"name": ..., "path": ...}', hint="send JSON") from None
        if not _MODEL_NAME.fullmatch(name):
            raise UsageError(
                f"model name {name!r} is not valid", hint="use letters, digits, '.', '_' and '-'"
            )
        real = await anyio.Path(path).resolve()
        if not st.model_dirs or not any(real.is_relative_to(d) for d in st.model_dirs):
            raise UsageError(
                f"{path} is not under a configured model directory",
                hint="add its directory to server.model_dirs, or use a configured model name",
            )
        if not await anyio.Path(real).is_file():
            raise ModelNotFound(f"no model file at {path}", hint="check the path")
        return await st.supervisor.add_model(name, Path(real))

    return await _control(request, add)


async def api_reload(request: Request) -> Response:
    """
    summary: Re-read the config file; unchanged models keep running, changed ones are replaced.
    responses:
      200: {description: '{unchanged, changed, added, removed}'}
      400: {description: the new config is invalid; the old one keeps running}
    """

    async def do(st: GatewayState) -> Any:
        if st.reload is None:
            raise UsageError("this service was started without a config file to reload", hint="use --config")
        return await st.reload()

    return await _control(request, do)


async def api_events(request: Request) -> Response:
    """
    summary: Server-sent events of model state changes (load progress, crashes, restarts).
    responses:
      200: {description: "text/event-stream of {seq, time, model, kind, state, data}"}
    """
    st = _state(request)
    replay = request.query_params.get("replay") in ("1", "true")

    async def events() -> AsyncIterator[bytes]:
        async with st.supervisor.events.subscribe(replay=replay) as stream:
            yield b": connected\n\n"
            while True:
                with anyio.move_on_after(15) as scope:
                    ev = await stream.receive()
                if scope.cancelled_caught:
                    yield b": ping\n\n"
                    continue
                yield f"event: {ev.kind}\ndata: {json.dumps(ev.to_json())}\n\n".encode()

    return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


async def api_logs(request: Request) -> Response:
    """
    summary: The model's llama-server log (last lines; ?follow=1 streams new lines).
    responses:
      200: {description: text/plain}
    """
    st = _state(request)
    try:
        m = st.supervisor.get(request.path_params["name"])
    except ForgeError as exc:
        return error_response(exc, _rid(request))
    try:
        n = max(1, int(request.query_params.get("tail", "200")))
    except ValueError:
        return error_response(
            UsageError("tail must be a number of lines", hint="e.g. ?tail=200"), _rid(request)
        )
    follow = request.query_params.get("follow") in ("1", "true")
    path = m.status().get("log_path")
    lines: list[str] = []
    if path and await anyio.Path(path).exists():
        text = await anyio.Path(path).read_text(encoding="utf-8", errors="replace")
        lines = text.splitlines()[-n:]
    if not follow:
        return PlainTextResponse("\n".join(lines) + ("\n" if lines else ""))

    async def tail() -> AsyncIterator[bytes]:
        for line in lines:
            yield (line + "\n").encode()
        async with st.supervisor.log_bus.subscribe() as stream:
            async for ev in stream:
                if ev.model == m.name:
                    yield (str(ev.data.get("line", "")) + "\n").encode()

    return StreamingResponse(tail(), media_type="text/plain")


async def api_openapi(request: Request) -> Response:
    from starlette.schemas import SchemaGenerator

    gen = SchemaGenerator({"openapi": "3.0.0", "info": {"title": "forge control API", "version": "1"}})
    return JSONResponse(gen.get_schema(routes=request.app.routes))


def create_app(state: GatewayState, *, cors_origins: list[str] | None = None) -> Starlette:
    routes = [
        Route("/health", _health, methods=["GET"]),
        Route("/ready", _ready, methods=["GET"]),
        Route("/metrics", _metrics, methods=["GET"]),
        Route("/v1/models", _models, methods=["GET"]),
        Route("/v1/chat/completions", _proxy, methods=["POST"]),
        Route("/v1/completions", _proxy, methods=["POST"]),
        Route("/v1/embeddings", _proxy, methods=["POST"]),
        Route("/api/models", api_models, methods=["GET"]),
        Route("/api/models", api_add, methods=["POST"]),
        Route("/api/models/{name}/load", api_load, methods=["POST"]),
        Route("/api/models/{name}/unload", api_unload, methods=["POST"]),
        Route("/api/models/{name}/logs", api_logs, methods=["GET"]),
        Route("/api/reload", api_reload, methods=["POST"]),
        Route("/api/events", api_events, methods=["GET"]),
        Route("/api/openapi.json", api_openapi, methods=["GET"], include_in_schema=False),
    ]
    middleware = [Middleware(_RequestContext, state=state)]
    if cors_origins:
        middleware.insert(
            0,
            Middleware(CORSMiddleware, allow_origins=cors_origins, allow_methods=["*"], allow_headers=["*"]),
        )
    app = Starlette(routes=routes, middleware=middleware)
    app.state.gateway = state
    return app
