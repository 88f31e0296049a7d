"""The control API under ``/api/*``: list, add, load, unload, reload, events, logs, plan.

Each route asks the supervisor and returns JSON; a typed error becomes a response through
``_errors_http`` (via :func:`_control`), never a status picked here.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import BaseRoute, Route

from ..._errors import ForgeError, InvalidRequest, ModelNotFound, ServiceError, UsageError
from ...config import MODEL_NAME
from ...process import IDLE_LINE_RE, without_idle
from ...supervisor import Event, ModelStatus
from ..core._recording import request_key
from ..core._state import GatewayState, read_body, request_id, state_of
from ..core._visibility import ModelScope, model_scope
from ..edge._errors_http import error_response
from ..proxy._validate import parse_object
from . import _plan_api
from ._live import LiveStream

__all__ = ["routes"]


def routes() -> list[BaseRoute]:
    return [
        Route("/api/models", api_models, methods=["GET"]),
        Route("/api/models", api_add, methods=["POST"]),
        Route("/api/models/{name}/load", api_load, methods=["POST"]),
        Route("/api/models/{name}/unload", api_unload, methods=["POST"]),
        Route("/api/models/{name}/logs", api_logs, methods=["GET"]),
        Route("/api/reload", api_reload, methods=["POST"]),
        Route("/api/events", api_events, methods=["GET"]),
        *_plan_api.routes(),
    ]


async def _control(request: Request, action: Callable[[GatewayState], Awaitable[Any]]) -> Response:
    """Run one action; a long one (a load waiting for its model) is answered 503 when the service
    starts stopping, instead of holding the shutdown for the whole drain period."""
    st = state_of(request)
    outcome: list[Any] = []

    async def run(scope: anyio.CancelScope) -> None:
        try:
            outcome.append(await action(st))
        except ForgeError as exc:
            outcome.append(exc)
        scope.cancel()

    async with anyio.create_task_group() as tg:
        tg.start_soon(run, tg.cancel_scope)
        await st.closing.wait()
        tg.cancel_scope.cancel()
    result = outcome[0] if outcome else ServiceError("the service is stopping", hint="retry when it is back")
    if isinstance(result, ForgeError):
        return error_response(result, request_id(request))
    return JSONResponse(result.to_json() if isinstance(result, ModelStatus) else result)


async def api_models(request: Request) -> Response:
    """
    summary: List the configured models with their state.
    responses:
      200: {description: "{models: [{name, state, pid, port, devices, restarts, last_error, uptime, memory, …}],
        key: {name, admin}} — a non-admin key's models only; key is null without keys"}
    """
    supervisor = state_of(request).supervisor
    # A key that may use only a variant or adapter (``X:json``) still sees the model serving it;
    # what a shown model's row says of the others (an error naming a holder) is redacted.
    seen = model_scope(request.scope, supervisor)
    rows = [seen.filtered(s.to_json()) for s in supervisor.status() if seen.sees(s.name)]
    key = request_key(request.scope)
    # The page shows the controls (load, unload, reload, config reload) to admin keys only.
    who = None if key is None else {"name": key.name, "admin": key.admin}
    return JSONResponse({"models": rows, "key": who})


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
    summary: Drain a model's in-flight requests, then stop its llama-server (keep_context saves its
      slots first). ?forget=true stops it without saving and deletes its saved contexts.
    responses:
      200: {description: the model's status}
      400: {description: forget is not true or false}
    """
    name = request.path_params["name"]
    try:
        forget = _flag(request.query_params.get("forget"))
    except InvalidRequest as exc:
        return error_response(exc, request_id(request))
    return await _control(request, lambda st: st.supervisor.unload(name, forget=forget))


def _flag(value: str | None) -> bool:
    """A boolean query parameter (``forget``): absent is false."""
    if value is None or value.lower() in ("0", "false", "no", ""):
        return False
    if value.lower() in ("1", "true", "yes"):
        return True
    raise InvalidRequest(
        f"forget={value!r} is not a boolean", param="forget", hint="send forget=true or forget=false"
    )


async def api_add(request: Request) -> Response:
    """
    summary: Register and load a model by path; only paths under the configured model_dirs.
    requestBody: {description: '{"name": "...", "path": "/models/x.gguf"}'}
    responses:
      200: {description: the model's status}
      400: {description: a path outside model_dirs, or a bad name}
    """

    async def add(st: GatewayState) -> Any:
        body = parse_object(await read_body(request, 65536))
        for key in ("name", "path"):
            if not isinstance(body.get(key), str):
                raise InvalidRequest(
                    f'field {key!r} must be a string: send {{"name": ..., "path": ...}}', param=key
                )
        name, path = str(body["name"]), Path(str(body["path"]))
        if not MODEL_NAME.fullmatch(name):
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
      200: {description: '{unchanged, changed, added, removed, failed}; restart_required: the [server] settings that apply at the next restart'}
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
    description: A key scoped to some models gets their events and the service's ("*"), with
      other models' names left out.
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
                shown = _event_as_seen(model_scope(request.scope, st.supervisor), ev)
                if shown is not None:
                    yield f"event: {ev.kind}\ndata: {json.dumps(shown)}\n\n".encode()

    return LiveStream(
        events(), st.closing, media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
    )


def _event_as_seen(seen: ModelScope, ev: Event) -> dict[str, Any] | None:
    """The event as the caller may see it: None for another model's; the service's own (``*``:
    ready, config) with the names of models it may not see left out of its data. Read with the
    models as they are now (a reload may add or remove some), so the scope is taken per event."""
    if seen.everything:
        return ev.to_json()
    if ev.model != "*" and not seen.sees(ev.model):
        return None
    shown = ev.to_json()
    data = shown["data"]
    # The service's events name models in lists (ready: preloaded; config: added, removed, …). A
    # removed model is no longer configured, so these are judged name by name, not as known names.
    if isinstance(data.get("preloaded"), list):
        data["preloaded"] = [n for n in data["preloaded"] if seen.sees(n)]
    if isinstance(data.get("changes"), dict):
        data["changes"] = {k: [n for n in v if seen.sees(n)] for k, v in data["changes"].items()}
    shown["data"] = seen.filtered(data)
    return shown


_LOG_WINDOW = 8 << 20


def _last_lines(path: Path, n: int, every: bool) -> list[str]:
    """The last ``n`` lines of a log (idle runs collapsed unless ``every``), from its last 8 MiB:
    a model's log grows for as long as the service runs."""
    with path.open("rb") as f:
        size = f.seek(0, 2)
        f.seek(max(0, size - _LOG_WINDOW))
        text = f.read().decode("utf-8", "replace")
    raw = text.splitlines()[1 if size > _LOG_WINDOW else 0 :]  # the first may be cut
    return list(raw if every else without_idle(raw))[-n:]


async def api_logs(request: Request) -> Response:
    """
    summary: The model's llama-server log (last lines; ?follow=1 streams new lines).
    description: Runs of llama-server's "all slots are idle" lines are collapsed into one note
      (?all=1 shows every line as written).
    responses:
      200: {description: text/plain}
      403: {description: the key may not use this model}
    """
    st = state_of(request)
    try:
        m = st.supervisor.view(request.path_params["name"])
        model_scope(request.scope, st.supervisor).check(m.name)  # a scoped key: its models' logs only
    except ForgeError as exc:
        return error_response(exc, request_id(request))
    try:
        n = max(1, int(request.query_params.get("tail", "200")))
    except ValueError:
        return error_response(
            UsageError("tail must be a number of lines", hint="e.g. ?tail=200"),
            request_id(request),
        )
    follow = request.query_params.get("follow") in ("1", "true")
    every = request.query_params.get("all") in ("1", "true")
    path = m.status.log_path
    lines: list[str] = []
    if path and await anyio.Path(path).exists():
        lines = await anyio.to_thread.run_sync(_last_lines, Path(path), n, every)
    if not follow:
        return PlainTextResponse("\n".join(lines) + ("\n" if lines else ""))

    async def tail() -> AsyncIterator[bytes]:
        for line in lines:
            yield (line + "\n").encode()
        async with st.supervisor.log_bus.subscribe() as stream:
            async for ev in stream:
                line = str(ev.data.get("line", ""))
                if ev.model == m.name and (every or not IDLE_LINE_RE.search(line)):
                    yield (line + "\n").encode()

    return LiveStream(tail(), st.closing, media_type="text/plain")
