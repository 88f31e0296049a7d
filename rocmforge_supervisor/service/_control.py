"""The control API under ``/api/*``: list, add, load, unload, reload, events, logs, OpenAPI.

Each route asks the supervisor and returns JSON; a typed error becomes a response through
``_errors_http`` (via :func:`_control`), never a status picked here.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Route

from .._errors import ForgeError, ModelNotFound, UsageError
from ._errors_http import error_response
from ._middleware import read_body
from ._state import GatewayState, request_id, state_of

__all__ = ["routes"]

_MODEL_NAME = re.compile(r"[A-Za-z0-9._-]{1,128}")


def routes() -> list[BaseRoute]:
    return [
        Route("/api/models", api_models, methods=["GET"]),
        Route("/api/models", api_add, methods=["POST"]),
        Route("/api/models/{name}/load", api_load, methods=["POST"]),
        Route("/api/models/{name}/unload", api_unload, methods=["POST"]),
        Route("/api/models/{name}/logs", api_logs, methods=["GET"]),
        Route("/api/reload", api_reload, methods=["POST"]),
        Route("/api/events", api_events, methods=["GET"]),
        Route("/api/openapi.json", api_openapi, methods=["GET"], include_in_schema=False),
    ]


async def _control(request: Request, action: Callable[[GatewayState], Awaitable[Any]]) -> Response:
    st = state_of(request)
    try:
        return JSONResponse(await action(st))
    except ForgeError as exc:
        return error_response(exc, request_id(request))


async def api_models(request: Request) -> Response:
    """
    summary: List the configured models with their state.
    responses:
      200: {description: "[{name, state, pid, port, devices, restarts, last_error, uptime, memory, …}]"}
    """
    return JSONResponse({"models": state_of(request).supervisor.status()})


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
            body = json.loads(await read_body(request, 65536))
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
    st = state_of(request)
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
    st = state_of(request)
    try:
        m = st.supervisor.get(request.path_params["name"])
    except ForgeError as exc:
        return error_response(exc, request_id(request))
    try:
        n = max(1, int(request.query_params.get("tail", "200")))
    except ValueError:
        return error_response(
            UsageError("tail must be a number of lines", hint="e.g. ?tail=200"), request_id(request)
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
