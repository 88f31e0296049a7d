"""The Ollama API on the gateway's endpoint (and on ``server.ollama_port``, where clients look).

Routes: ``/api/version``, ``/api/tags``, ``/api/show``, ``/api/ps``, ``/api/chat``,
``/api/generate``, ``/api/embed``, ``/api/embeddings``, ``/api/pull`` (:mod:`._ollama_pull`);
``/api/create``, ``/api/copy``,
``/api/push`` and ``/api/delete`` answer 501 with what to do instead. The control API keeps its
own paths (``/api/models``, ``/api/events``, ``/api/reload``, ``/api/openapi.json``): Ollama has
none of them, so both live under ``/api`` without a collision.

The handlers know nothing of processes or the proxy's internals: they get an :class:`OllamaBackend`
(the supervisor, for listings and load/unload; ``forward``, which acquires the model and sends one
request to its llama-server). Translation is in :mod:`._ollama_convert`, model facts in
:mod:`._ollama_meta`; errors take Ollama's ``{"error": "…"}`` shape from the one error map.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Route

from .. import __version__
from .._errors import ForgeError, InvalidRequest, ModelNotFound, RequestRejected, UsageError
from ..client import SSEDecoder
from ..config import get_settings
from ..models import ProjectorInfo, resolve_projector_path
from ..supervisor import Supervisor
from ._errors_http import UpstreamModel, error_response, upstream_error
from ._media import refuse_unusable_media
from ._ollama_convert import (
    ChatStream,
    Target,
    chat_reply,
    chat_target,
    embed_target,
    generate_reply,
    generate_target,
    native_piece,
    now_iso,
)
from ._ollama_meta import (
    ModelCard,
    capabilities,
    card_for,
    projector_for,
    ps_entry,
    show_entry,
    tag_entry,
)
from ._ollama_pull import api_pull
from ._recording import admit_model, note_finish, note_status, note_timing, note_usage
from ._routes import resolve_name
from ._tools import refuse_unusable_tools
from ._validate import parse_object

__all__ = [
    "OLLAMA_COMPAT_VERSION",
    "Forward",
    "OllamaBackend",
    "check_media",
    "check_tools",
    "model_list",
    "routes",
]

#: The Ollama version reported by ``/api/version``. Clients gate features on it (VS Code Copilot
#: refuses servers that look older than it needs: NoLlama#9); this is the Ollama API behaviour
#: these routes follow. forge's own version is in ``forge_version``.
OLLAMA_COMPAT_VERSION = "0.18.3"

#: (model, method, llama-server path, body, request id) → the child's streaming response; entering
#: acquires the model (waiting up to its load_wait), leaving releases it.
Forward = Callable[[str, str, str, bytes, str | None], AbstractAsyncContextManager[httpx.Response]]


@dataclass
class OllamaBackend:
    supervisor: Supervisor
    forward: Forward
    resolve_path: Callable[[str], Path | None]  # a model's GGUF path, without downloading; blocking
    _props_cache: dict[tuple[str, int], dict[str, Any]] | None = None


def _backend(request: Request) -> OllamaBackend:
    b: OllamaBackend = request.app.state.ollama
    return b


def _rid(request: Request) -> str | None:
    rid: str | None = request.scope.get("state", {}).get("request_id")
    return rid


async def _body(request: Request) -> dict[str, Any]:
    return parse_object(await request.body() or b"{}")  # any bad body (depth, range…) is a 400


def _model(b: OllamaBackend, body: dict[str, Any]) -> str:
    name = body.get("model") or body.get("name")
    if not isinstance(name, str) or not name:
        raise UsageError('the request has no "model" field', hint="name one of GET /api/tags")
    name = resolve_name(name, b.supervisor.names())
    b.supervisor.view(name)  # ModelNotFound → 404 before anything waits
    return name


async def _card(b: OllamaBackend, name: str) -> ModelCard | None:
    v = b.supervisor.view(name)

    def read() -> ModelCard | None:
        p = v.model_path or b.resolve_path(v.config.path)
        if p is None:
            return None
        try:
            return card_for(p)
        except (ForgeError, OSError):
            return None

    return await anyio.to_thread.run_sync(read)


async def _props(b: OllamaBackend, name: str, rid: str | None) -> dict[str, Any] | None:
    """The running child's ``/props`` (read once per child process); None when it is not ready."""
    v = b.supervisor.view(name)
    child = v.child
    if not v.ready or child is None or child.pid is None:
        return None
    cache = b._props_cache if b._props_cache is not None else {}
    b._props_cache = cache
    key = (name, child.pid)
    if key not in cache:
        try:
            async with b.forward(name, "GET", "/props", b"", rid) as r:
                props = json.loads(await r.aread())
        except (ForgeError, httpx.HTTPError, ValueError):
            return None
        if not isinstance(props, dict):
            return None
        cache[key] = props
    return cache[key]


async def _served_ctx(b: OllamaBackend, name: str, rid: str | None) -> int | None:
    """Tokens one request can use: the running child's per-slot n_ctx, else the config's."""
    props = await _props(b, name, rid)
    if props is not None:
        try:
            return int(props["default_generation_settings"]["n_ctx"])
        except (KeyError, TypeError, ValueError):
            return None
    v = b.supervisor.view(name)
    if v.ready:
        return None
    if v.config.ctx_size:
        return v.config.ctx_size // (v.config.parallel or 1)
    return None


async def _projector(b: OllamaBackend, name: str) -> ProjectorInfo | None:
    """The model's projector: as its child was started, else its configured ``mmproj`` when that
    is a local file (or ``auto`` beside a local model); None for one not fetched yet."""
    v = b.supervisor.view(name)
    if v.projector is not None:
        return v.projector
    mmproj = v.config.mmproj
    model_ref = v.config.path
    if not mmproj or mmproj.startswith("hf:") or (mmproj == "auto" and model_ref.startswith("hf:")):
        return None  # a listing must never start a download

    def read() -> ProjectorInfo | None:
        model_path = v.model_path if v.started else b.resolve_path(model_ref)
        if model_path is None:
            return None
        try:
            return projector_for(resolve_projector_path(mmproj, model_ref, model_path, get_settings()))
        except (ForgeError, OSError):
            return None

    return await anyio.to_thread.run_sync(read)


async def _modalities(b: OllamaBackend, name: str, rid: str | None) -> tuple[str, ...]:
    """What the model takes besides text: the running child's ``/props.modalities``, else what
    its projector file says."""
    props = await _props(b, name, rid)
    if props is not None and isinstance(props.get("modalities"), dict):
        return tuple(k for k in ("vision", "audio") if props["modalities"].get(k))
    projector = await _projector(b, name)
    return projector.modalities if projector is not None else ()


def _args(b: OllamaBackend, name: str) -> list[str]:
    """The child's extra llama-server arguments (as started, else as configured)."""
    return list(b.supervisor.view(name).args)


async def check_tools(b: OllamaBackend, name: str, body: dict[str, Any]) -> None:
    """A 400 when ``body`` sends tools that model ``name`` cannot use (:mod:`._tools`): every
    route's way to that one check, with the model's card and arguments as ``/v1/models`` reads them."""
    refuse_unusable_tools(name, body, await _card(b, name), _args(b, name))


def check_media(supervisor: Supervisor, name: str, body: dict[str, Any], *, allow_remote: bool) -> None:
    """A 400 when ``body``'s images/audio cannot go to model ``name`` (:mod:`._media`): the one
    check every API's requests meet, with whether the model has a projector (``mmproj``)."""
    has_projector = bool(supervisor.view(name).config.mmproj)
    refuse_unusable_media(name, body, has_projector=has_projector, allow_remote=allow_remote)


async def model_list(b: OllamaBackend, created: float) -> list[dict[str, Any]]:
    """``/v1/models``' entries: OpenAI's keys plus ``context_length``, ``capabilities``, ``state``."""
    data = []
    for v in b.supervisor.views():
        name = v.name
        card = await _card(b, name)
        entry: dict[str, Any] = {
            "id": name,
            "object": "model",
            "created": int(created),
            "owned_by": "rocmforge",
            "state": v.state.value,
            "backend": v.config.backend,
        }
        ctx = await _served_ctx(b, name, None)
        if card is not None:
            entry["context_length"] = ctx or card.trained_ctx
            entry["capabilities"] = capabilities(card, _args(b, name), await _modalities(b, name, None))
        elif ctx:
            entry["context_length"] = ctx
        data.append(entry)
    return data


# -- listings ---------------------------------------------------------------------------------------


async def api_version(request: Request) -> Response:
    return JSONResponse({"version": OLLAMA_COMPAT_VERSION, "forge_version": __version__})


async def api_tags(request: Request) -> Response:
    b = _backend(request)
    models = []
    for name in b.supervisor.names():
        card = await _card(b, name)
        caps = capabilities(card, _args(b, name), await _modalities(b, name, None)) if card else None
        models.append(tag_entry(name, card, caps))
    return JSONResponse({"models": models})


async def api_show(request: Request) -> Response:
    b = _backend(request)
    try:
        name = _model(b, await _body(request))
        admit_model(request.scope, name)  # a key's models only
        if b.supervisor.view(name).config.backend == "whisper":
            raise InvalidRequest(
                f"model {name!r} is a whisper (speech to text) model: /api/show describes GGUF models",
                param="model",
                hint="GET /api/models shows it (backend, state, memory)",
            )
        card = await _card(b, name)
        if card is None:
            raise ModelNotFound(
                f"model {name!r} has no local file yet", hint=f"load it first: forge load {name}"
            )
        args = _args(b, name)
        ctx = await _served_ctx(b, name, _rid(request))
        modalities = await _modalities(b, name, _rid(request))
        projector = await _projector(b, name)
    except ForgeError as exc:
        return error_response(exc, _rid(request), "ollama")
    return JSONResponse(show_entry(card, args, ctx, modalities, projector))


async def api_ps(request: Request) -> Response:
    b = _backend(request)
    out = []
    for v in b.supervisor.views():
        if not v.ready:
            continue
        ctx = await _served_ctx(b, v.name, _rid(request))
        out.append(ps_entry(v.name, await _card(b, v.name), v.status.to_json(), ctx, v.ttl))
    return JSONResponse({"models": out})


async def api_unsupported(request: Request) -> Response:
    what = {
        "/api/create": "models are GGUF files: add one under [models.NAME] in forge.toml (or POST /api/models with a path under server.model_dirs)",
        "/api/copy": "serve the same file under a second name: another [models.NAME] with the same path",
        "/api/push": "forge does not publish models; upload the GGUF to Hugging Face with `hf upload`",
        "/api/delete": "remove the model's [models.NAME] section and POST /api/reload (forge never deletes model files)",
    }[request.url.path]
    return JSONResponse({"error": f"{request.url.path} is not supported by forge: {what}"}, status_code=501)


# -- generation -------------------------------------------------------------------------------------


async def api_chat(request: Request) -> Response:
    return await _generation(request, generate=False)


async def api_generate(request: Request) -> Response:
    return await _generation(request, generate=True)


async def api_embed(request: Request) -> Response:
    return await _generation(request, generate=False, embed="embed")


async def api_embeddings(request: Request) -> Response:
    return await _generation(request, generate=False, embed="embeddings")


async def _generation(request: Request, *, generate: bool, embed: str | None = None) -> Response:
    b = _backend(request)
    rid = _rid(request)
    try:
        body = await _body(request)
        name = _model(b, body)
        admit_model(request.scope, name, stream=not embed and body.get("stream") is not False)
        if embed:
            target = embed_target(body, name, legacy=embed == "embeddings")
        elif generate:
            target = generate_target(body, name)
        else:
            await check_tools(b, name, body)
            target = chat_target(body, name)
        if not embed:  # Ollama sends images as base64 only: the translated parts are checked
            check_media(b.supervisor, name, target.payload, allow_remote=False)
        _keep_alive(b, name, target.keep_alive)
        empty = not embed and not (
            body.get("messages") if not generate else (body.get("prompt") or body.get("suffix"))
        )
        if empty:  # Ollama's idiom: no prompt = load the model (or unload it with keep_alive 0)
            return await _load_or_unload(b, name, target, generate, rid)
        if target.num_ctx is not None:
            served = await _served_ctx(b, name, rid)
            if served is not None and target.num_ctx > served:
                raise RequestRejected(
                    f"options.num_ctx={target.num_ctx} is more than model {name!r} serves ({served} tokens per request)",
                    hint=f"lower num_ctx, or raise ctx_size for [models.{name}] in forge.toml",
                )
    except ForgeError as exc:
        return error_response(exc, rid, "ollama")
    return await _send(b, name, target, rid, generate=generate)


def _keep_alive(b: OllamaBackend, name: str, seconds: float | None) -> None:
    """``keep_alive`` is a TTL hint, set by each request as in Ollama (a request without one
    clears it); the model's own ``ttl`` in forge.toml, when set, wins. Negative: never unload."""
    b.supervisor.hint_ttl(name, None if seconds is None or seconds < 0 else max(seconds, 0.01))


async def _load_or_unload(
    b: OllamaBackend, name: str, target: Target, generate: bool, rid: str | None
) -> Response:
    if target.keep_alive is not None and target.keep_alive == 0:
        await b.supervisor.unload(name)
        b.supervisor.hint_ttl(name, None)  # the unload is done; the next load starts afresh
        reason = "unload"
    else:
        async with b.supervisor.acquire(name, load_wait=b.supervisor.load_wait(name)):
            pass
        reason = "load"
    head: dict[str, Any] = {"model": name, "created_at": now_iso()}
    head.update({"response": ""} if generate else {"message": {"role": "assistant", "content": ""}})
    return JSONResponse({**head, "done": True, "done_reason": reason})


async def _send(b: OllamaBackend, name: str, target: Target, rid: str | None, *, generate: bool) -> Response:
    started = time.perf_counter()
    stack = AsyncExitStack()
    body = json.dumps(target.payload).encode()
    try:
        up = await stack.enter_async_context(b.forward(name, "POST", target.path, body, rid))
        if up.status_code != 200 or not target.payload.get("stream"):
            raw = await up.aread()
            await stack.aclose()
            return _reply(up.status_code, raw, name, target, started, generate)
    except ForgeError as exc:
        await stack.aclose()
        return error_response(exc, rid, "ollama")
    except BaseException:
        with anyio.CancelScope(shield=True):
            await stack.aclose()
        raise

    async def lines() -> AsyncIterator[bytes]:
        try:
            async for obj in _translate_stream(up, name, target, started, generate):
                note_timing(first_byte=True)
                yield json.dumps(_noted(obj), separators=(",", ":")).encode() + b"\n"
        except httpx.HTTPError as exc:
            note_status(502, "stream_broken")
            yield (
                json.dumps(
                    {"error": f"model {name!r} stopped mid-stream: {exc}"}, separators=(",", ":")
                ).encode()
                + b"\n"
            )
        finally:
            with anyio.CancelScope(shield=True):
                await stack.aclose()

    return _ClosingStream(lines(), stack, media_type="application/x-ndjson")


class _ClosingStream(StreamingResponse):
    """Releases the model however the response ends, even if the body never started."""

    def __init__(self, content: AsyncIterator[bytes], stack: AsyncExitStack, **kw: Any) -> None:
        super().__init__(content, **kw)
        self._stack = stack

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                await self._stack.aclose()


def _upstream_error(status: int, raw: bytes, name: str) -> Response:
    """llama-server's error through the one map (client faults 4xx), in Ollama's shape."""
    return error_response(upstream_error(UpstreamModel(name), status, raw), dialect="ollama")


def _noted(obj: dict[str, Any]) -> dict[str, Any]:
    """An answer (or a stream's last line) with its counts, noted in the activity record."""
    if obj.get("done") or "prompt_eval_count" in obj:
        note_usage(obj.get("prompt_eval_count"), obj.get("eval_count"))
        note_finish(obj.get("done_reason"))
    return obj


def _reply(status: int, raw: bytes, name: str, target: Target, started: float, generate: bool) -> Response:
    if status != 200:
        return _upstream_error(status, raw, name)
    data = json.loads(raw)
    if target.kind == "embed":
        vectors = [d["embedding"] for d in sorted(data.get("data", []), key=lambda d: d.get("index", 0))]
        usage = data.get("usage") or {}
        return JSONResponse(
            _noted(
                {
                    "model": name,
                    "embeddings": vectors,
                    "total_duration": int((time.perf_counter() - started) * 1e9),
                    "load_duration": 0,
                    "prompt_eval_count": int(usage.get("prompt_tokens", 0) or 0),
                }
            )
        )
    if target.kind == "embeddings":
        return JSONResponse({"embedding": data["data"][0]["embedding"]})
    if target.kind == "native":
        return JSONResponse(_noted(generate_reply(data, name, started)))
    return JSONResponse(_noted(chat_reply(data, name, started, generate=generate)))


async def _translate_stream(
    up: httpx.Response, name: str, target: Target, started: float, generate: bool
) -> AsyncIterator[dict[str, Any]]:
    decoder = SSEDecoder()
    chat = ChatStream(name, started, generate=generate)
    async for chunk in up.aiter_raw():
        for ev in decoder.feed(chunk):
            if not ev.data or ev.data == "[DONE]":
                continue
            data = json.loads(ev.data)
            if "error" in data:
                err = data["error"]
                yield {"error": err.get("message") if isinstance(err, dict) else str(err)}
                return
            if target.kind == "native":
                piece = native_piece(data, name, started)
                yield piece
                if piece["done"]:
                    return
                continue
            for line in chat.feed(data):
                yield line
    if target.kind != "native":
        yield chat.finish()


def routes() -> list[BaseRoute]:
    """The Ollama API's routes (the app puts an :class:`OllamaBackend` in ``app.state.ollama``)."""
    return [
        Route("/api/version", api_version, methods=["GET"], include_in_schema=False),
        Route("/api/tags", api_tags, methods=["GET"], include_in_schema=False),
        Route("/api/show", api_show, methods=["POST"], include_in_schema=False),
        Route("/api/ps", api_ps, methods=["GET"], include_in_schema=False),
        Route("/api/chat", api_chat, methods=["POST"], include_in_schema=False),
        Route("/api/generate", api_generate, methods=["POST"], include_in_schema=False),
        Route("/api/embed", api_embed, methods=["POST"], include_in_schema=False),
        Route("/api/embeddings", api_embeddings, methods=["POST"], include_in_schema=False),
        Route("/api/pull", api_pull, methods=["POST"], include_in_schema=False),
        *(
            Route(p, api_unsupported, methods=["POST", "DELETE"], include_in_schema=False)
            for p in ("/api/create", "/api/copy", "/api/push", "/api/delete")
        ),
    ]
