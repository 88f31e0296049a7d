"""The model routes: forward a request to the llama-server of the model it names.

One generic path for every forwarded route — parse (only the ``model`` and ``stream`` fields) →
``supervisor.acquire`` (a slot, as an :class:`Upstream`) → ``client/_transport`` (retry on a stale
keep-alive, httpx errors typed) → stream through or buffer → release. Which gateway paths go to
which child paths is the table :data:`FORWARDED`; a new llama-server route is a line there.

Streams are passed through chunk by chunk (``aiter_raw``), never re-parsed: only the tail is kept,
for the usage counters and to notice a stream that ended without ``[DONE]``. A child that dies
mid-stream ends the client's stream with an SSE error chunk in llama-server's own shape.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

import anyio
import httpx
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Route
from starlette.types import Receive, Scope, Send

from .._errors import ForgeError, StreamError, UsageError
from ..client._transport import Upstream, asend, map_httpx_errors
from ._errors_http import error_response, sse_error_chunk
from ._middleware import read_body
from ._state import GatewayState, request_id, state_of

__all__ = ["FORWARDED", "Forward", "routes"]

log = logging.getLogger("rocmforge.gateway")

_PASS_HEADERS = ("content-type",)


@dataclass(frozen=True)
class Forward:
    """A gateway route forwarded to the model named in the request body's ``model`` field."""

    path: str
    upstream_path: str | None = None  # the child's path; the same as ``path`` when None
    methods: tuple[str, ...] = ("POST",)

    @property
    def target(self) -> str:
        return self.upstream_path or self.path


FORWARDED: tuple[Forward, ...] = (
    Forward("/v1/chat/completions"),
    Forward("/v1/completions"),
    Forward("/v1/embeddings"),
)


def routes() -> list[BaseRoute]:
    """The forwarded routes (:data:`FORWARDED`) and ``GET /v1/models``."""
    out: list[BaseRoute] = [Route("/v1/models", _models, methods=["GET"])]
    out += [Route(f.path, _forwarder(f), methods=list(f.methods)) for f in FORWARDED]
    return out


@dataclass(frozen=True)
class _Call:
    """What the gateway reads of a request: the model, whether it streams, and the bytes to send."""

    name: str
    stream: bool
    body: bytes
    endpoint: str
    request_id: str | None
    received: float


def _forwarder(route: Forward) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        st = state_of(request)
        try:
            call = await _parse(request, st)
        except ForgeError as exc:
            st.metrics.errors.labels("-", type(exc).__name__).inc()
            return error_response(exc, request_id(request))
        return await _forward(st, call, route.target)

    endpoint.__name__ = f"forward_{route.path.strip('/').replace('/', '_')}"
    return endpoint


async def _parse(request: Request, st: GatewayState) -> _Call:
    received = time.perf_counter()
    body = await read_body(request, st.max_body_bytes)
    try:
        payload = json.loads(body)
    except ValueError:
        raise UsageError("the request body is not valid JSON", hint="send a JSON object") from None
    if not isinstance(payload, dict) or not isinstance(payload.get("model"), str):
        raise UsageError('the request has no "model" field', hint="name one of GET /v1/models")
    name: str = payload["model"]
    st.supervisor.get(name)  # 404 before queueing
    return _Call(name, bool(payload.get("stream")), body, request.url.path, request_id(request), received)


async def _forward(st: GatewayState, call: _Call, path: str) -> Response:
    stack = AsyncExitStack()
    headers = {"Content-Type": "application/json"}
    if call.request_id:
        headers["X-Request-ID"] = call.request_id
    try:
        upstream = await stack.enter_async_context(st.supervisor.acquire(call.name))
        response = await asend(
            st.upstream, upstream, "POST", path, content=call.body, headers=upstream.headers(headers)
        )
    except ForgeError as exc:
        await stack.aclose()
        st.metrics.requests.labels(call.name, call.endpoint, "error").inc()
        st.metrics.errors.labels(call.name, type(exc).__name__).inc()
        return error_response(exc, call.request_id)
    except BaseException:
        with anyio.CancelScope(shield=True):
            await stack.aclose()
        raise
    if not call.stream or response.status_code != 200:
        return await _buffered(st, call, upstream, response, stack)
    return _streamed(st, call, upstream, response, stack)


def _response_headers(call: _Call, response: httpx.Response) -> dict[str, str]:
    headers = {k: v for k, v in response.headers.items() if k.lower() in _PASS_HEADERS}
    if call.request_id:
        headers["X-Request-ID"] = call.request_id
    return headers


async def _buffered(
    st: GatewayState, call: _Call, upstream: Upstream, response: httpx.Response, stack: AsyncExitStack
) -> Response:
    try:
        with map_httpx_errors(upstream, streaming=True):
            content = await response.aread()
    except StreamError as exc:
        st.metrics.requests.labels(call.name, call.endpoint, "502").inc()
        st.metrics.errors.labels(call.name, "stream_broken").inc()
        return error_response(exc, call.request_id)
    finally:
        with anyio.CancelScope(shield=True):
            await response.aclose()
            await stack.aclose()
    elapsed = time.perf_counter() - call.received
    st.metrics.ttft.labels(call.name).observe(elapsed)
    st.metrics.duration.labels(call.name).observe(elapsed)
    st.metrics.requests.labels(call.name, call.endpoint, str(response.status_code)).inc()
    if response.status_code == 200:
        _count_usage(st, call.name, content)
    return Response(content, status_code=response.status_code, headers=_response_headers(call, response))


def _streamed(
    st: GatewayState, call: _Call, upstream: Upstream, response: httpx.Response, stack: AsyncExitStack
) -> Response:
    released = False

    async def release() -> None:
        """Close the upstream (llama-server stops generating) and give the slot back — once,
        shielded; from the stream's end, or from the response if the stream never started."""
        nonlocal released
        if released:
            return
        released = True
        with anyio.CancelScope(shield=True):
            await response.aclose()
            await stack.aclose()

    async def passthrough() -> AsyncIterator[bytes]:
        first, tail, status = True, b"", "200"
        try:
            with map_httpx_errors(upstream, streaming=True):
                async for chunk in response.aiter_raw():
                    if first:
                        st.metrics.ttft.labels(call.name).observe(time.perf_counter() - call.received)
                        first = False
                    tail = (tail + chunk)[-4096:]
                    yield chunk
                if b"[DONE]" not in tail and b'"error"' not in tail:
                    raise httpx.RemoteProtocolError("the stream ended without [DONE]")
        except StreamError as exc:
            status = "502"
            st.metrics.errors.labels(call.name, "stream_broken").inc()
            broken = StreamError(
                f"model {call.name!r} stopped mid-stream ({exc.__cause__})", hint="it is being restarted"
            )
            log.warning(
                "request %s: %s",
                call.request_id,
                broken,
                extra={"model": call.name, "request_id": call.request_id},
            )
            yield sse_error_chunk(broken)
        finally:
            await release()
            st.metrics.duration.labels(call.name).observe(time.perf_counter() - call.received)
            st.metrics.requests.labels(call.name, call.endpoint, status).inc()
            _count_usage(st, call.name, tail)

    headers = _response_headers(call, response)
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
    """The configured models, in OpenAI's list shape (with each one's state)."""
    st = state_of(request)
    created = int(st.supervisor.started_at)
    data = [
        {"id": s["name"], "object": "model", "created": created, "owned_by": "rocmforge", "state": s["state"]}
        for s in st.supervisor.status()
    ]
    return JSONResponse({"object": "list", "data": data})
