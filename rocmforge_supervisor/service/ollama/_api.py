"""The Ollama API on the gateway's endpoint (and on ``server.ollama_port``, where clients look).

Routes: ``/api/version``, ``/api/tags``, ``/api/show``, ``/api/ps``, ``/api/chat``,
``/api/generate``, ``/api/embed``, ``/api/embeddings``, ``/api/pull`` (:mod:`._pull`);
``/api/create``, ``/api/copy``,
``/api/push`` and ``/api/delete`` answer 501 with what to do instead. The control API keeps its
own paths (``/api/models``, ``/api/events``, ``/api/reload``, ``/api/openapi.json``): Ollama has
none of them, so both live under ``/api`` without a collision.

The handlers know nothing of processes or the proxy's internals: they get an :class:`OllamaBackend`
(the models' facts, shared with ``/v1/models`` — :mod:`.._listing`; ``forward``, which acquires
the model and sends one request to its llama-server). Translation is in :mod:`._convert`, Ollama's
shapes of the model facts in :mod:`._meta`; errors take Ollama's ``{"error": "…"}`` shape from the
one error map. Nothing in the core imports this package except the app that mounts its routes.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp

from ... import __version__
from ..._errors import ForgeError, InvalidRequest, ModelNotFound, RequestRejected, UsageError
from ...client import SSEDecoder
from ...supervisor import Supervisor, backend_of
from ..core._names import ServedName, served_names, split_name
from ..core._recording import admit_model, request_key
from ..core._routes import OLLAMA_MODEL_ROUTES, ForwardRoute
from ..core._state import GatewayState
from ..edge._errors_http import error_response
from ..proxy._ingress import Intent, Outgoing, endpoint
from ..proxy._ingress import Target as ChildRequest
from ..proxy._listing import ModelFacts, visible_models
from ..proxy._validate import parse_object
from ._convert import (
    ChatStream,
    Target,
    chat_reply,
    chat_target,
    embed_target,
    generate_reply,
    generate_target,
    keep_alive_seconds,
    native_piece,
    now_iso,
)
from ._meta import ps_entry, show_entry, tag_entry, with_variant
from ._pull import api_pull

__all__ = ["OLLAMA_COMPAT_VERSION", "OllamaAdapter", "OllamaBackend", "routes"]

#: The Ollama version reported by ``/api/version``. Clients gate features on it (VS Code Copilot
#: refuses servers that look older than it needs: NoLlama#9); this is the Ollama API behaviour
#: these routes follow. forge's own version is in ``forge_version``.
OLLAMA_COMPAT_VERSION = "0.18.3"


@dataclass(frozen=True)
class OllamaBackend:
    """What the Ollama routes need from the core: the models' facts (shared with ``/v1/models``,
    and through them the supervisor, for load/unload)."""

    facts: ModelFacts

    @property
    def supervisor(self) -> Supervisor:
        return self.facts.supervisor


def _rid(request: Request) -> str | None:
    rid: str | None = request.scope.get("state", {}).get("request_id")
    return rid


async def _body(request: Request) -> dict[str, Any]:
    return parse_object(await request.body() or b"{}")  # any bad body (depth, range…) is a 400


def _model(b: OllamaBackend, body: dict[str, Any]) -> ServedName:
    name = body.get("model") or body.get("name")
    if not isinstance(name, str) or not name:
        raise UsageError('the request has no "model" field', hint="name one of GET /api/tags")
    served = split_name(name, b.supervisor.names(), b.supervisor.config_of)
    b.supervisor.config_of(served.model)  # ModelNotFound → 404 before anything waits
    return served


# -- listings ---------------------------------------------------------------------------------------


async def api_version(request: Request) -> Response:
    return JSONResponse({"version": OLLAMA_COMPAT_VERSION, "forge_version": __version__})


async def api_tags(b: OllamaBackend, request: Request) -> Response:
    models = []
    for name in b.supervisor.names():
        shown = visible_models(request.scope, [name, *served_names(name, b.supervisor.config_of(name))])
        if not shown:
            continue
        card = await b.facts.card(name)
        caps = await b.facts.capabilities(name, card) if card else None
        models += [tag_entry(n, card, caps) for n in shown]  # a variant or adapter: its model's file
    return JSONResponse({"models": models})


async def api_show(b: OllamaBackend, request: Request) -> Response:
    try:
        served = _model(b, await _body(request))
        name = served.model
        admit_model(request.scope, served.asked)  # a key's models only
        backend = backend_of(b.supervisor.config_of(name))
        if not backend.has_slots:  # only a llama-server model is a GGUF this can describe
            raise InvalidRequest(
                f"model {name!r} is {backend.what}: /api/show describes GGUF models",
                param="model",
                hint="GET /api/models shows it (backend, state, memory)",
            )
        card = await b.facts.card(name)
        if card is None:
            raise ModelNotFound(
                f"model {name!r} has no local file yet", hint=f"load it first: forge load {name}"
            )
        args = b.facts.args(name)
        ctx = await b.facts.served_ctx(name)
        modalities = await b.facts.modalities(name)
        projector = await b.facts.projector(name)
        caps = await b.facts.capabilities(name, card)
    except ForgeError as exc:
        return error_response(exc, _rid(request), "ollama")
    return JSONResponse(with_variant(show_entry(card, args, ctx, modalities, projector, caps), served))


async def api_ps(b: OllamaBackend, request: Request) -> Response:
    out = []
    for v in b.supervisor.views():
        # A key scoped to some models: theirs only (an admin key sees every loaded model).
        names = [v.name, *served_names(v.name, v.config)]
        if not v.ready or v.status.peer is not None or not visible_models(request.scope, names, control=True):
            continue
        ctx = await b.facts.served_ctx(v.name)
        out.append(ps_entry(v.name, await b.facts.card(v.name), v.status.to_json(), ctx, v.ttl))
    return JSONResponse({"models": out})


async def api_unsupported(request: Request) -> Response:
    what = {
        "/api/create": "models are GGUF files: add one under [models.NAME] in forge.toml (or POST /api/models with a path under server.model_dirs)",
        "/api/copy": "serve the same file under a second name: another [models.NAME] with the same path",
        "/api/push": "forge does not publish models; upload the GGUF to Hugging Face with `hf upload`",
        "/api/delete": "remove the model's [models.NAME] section and POST /api/reload (forge never deletes model files)",
    }[request.url.path]
    return JSONResponse({"error": f"{request.url.path} is not supported by forge: {what}"}, status_code=501)


# -- generation: Ollama's adapter to the one ingress ------------------------------------------------


@dataclass
class _OllamaIntent(Intent):
    """An Ollama request as read: its own body (translated once its model is known)."""

    body: dict[str, Any] = field(default_factory=dict)
    controls: bool = True  # its keep_alive applies (an admin key, or no keys)


class OllamaAdapter:
    """Ollama's ``/api/chat``, ``/generate``, ``/embed`` and ``/embeddings`` on the one ingress
    (``proxy/_ingress``): read in Ollama's terms, translated to llama-server's (``_convert``), its
    answer translated back (:class:`_OllamaAnswer`). Ollama's own idioms are its last word: an
    empty prompt loads the model (``keep_alive: 0`` unloads it), ``keep_alive`` sets its TTL,
    ``options.num_ctx`` is checked against the served context."""

    remote_media = False  # Ollama sends images as base64 only
    keepalive = False  # an NDJSON stream has no comment line; the connection is kept, as Ollama keeps it

    def __init__(self, b: OllamaBackend, kind: str) -> None:
        self.b = b
        self.kind = kind  # chat | generate | embed | embeddings

    async def read(self, st: GatewayState, route: ForwardRoute, request: Request, body: bytes) -> Intent:
        parsed = parse_object(body or b"{}")  # any bad body (depth, range…) is a 400
        _check_types(self.kind, parsed)
        name = parsed.get("model") or parsed.get("name")
        if not isinstance(name, str) or not name:
            raise UsageError('the request has no "model" field', hint="name one of GET /api/tags")
        embed = self.kind in ("embed", "embeddings")
        options = parsed.get("options")
        return _OllamaIntent(
            name,
            not embed and parsed.get("stream") is not False,
            parsed,
            tools=self.kind == "chat" and bool(parsed.get("tools")),  # only a chat body that sends tools
            length_given=isinstance(options, dict) and "num_predict" in options,
            body=parsed,
        )

    def control(self, request: Request, served: ServedName, intent: Intent) -> None:
        assert isinstance(intent, _OllamaIntent)
        intent.controls = _may_control(
            request, served.model, keep_alive_seconds(intent.body.get("keep_alive"))
        )

    def target(self, route: ForwardRoute, served: ServedName, intent: Intent) -> ChildRequest | None:
        assert isinstance(intent, _OllamaIntent)
        if self.kind in ("embed", "embeddings"):
            target = embed_target(intent.body, served.model, legacy=self.kind == "embeddings")
        elif self.kind == "generate":
            target = generate_target(intent.body, served.model)
        else:
            target = chat_target(intent.body, served.model)
        target.changed = True  # a translation: always serialized
        return target

    async def outgoing(
        self,
        st: GatewayState,
        route: ForwardRoute,
        request: Request,
        served: ServedName,
        intent: Intent,
        body: bytes,
        target: ChildRequest | None,
    ) -> Outgoing | Response:
        assert isinstance(intent, _OllamaIntent) and isinstance(target, Target)
        name, generate = served.model, self.kind == "generate"
        if intent.controls:
            _keep_alive(self.b, name, target.keep_alive)
        asked = (
            intent.body.get("prompt") or intent.body.get("suffix")
            if generate
            else intent.body.get("messages")
        )
        if self.kind in ("chat", "generate") and not asked:
            # Ollama's idiom: no prompt = load the model (or unload it with keep_alive 0)
            return await _load_or_unload(self.b, name, target, generate)
        if target.num_ctx is not None:
            ctx = await self.b.facts.served_ctx(name)
            if ctx is not None and target.num_ctx > ctx:
                raise RequestRejected(
                    f"options.num_ctx={target.num_ctx} is more than model {name!r} serves ({ctx} tokens per request)",
                    hint=f"lower num_ctx, or raise ctx_size for [models.{name}] in forge.toml",
                )
        answer = _OllamaAnswer(served.asked, target, time.perf_counter(), generate)
        return Outgoing(target.path, json.dumps(target.payload).encode(), "application/json", answer)


#: Top-level fields of Ollama's requests whose type its server checks as it decodes the body (a
#: ``"stream": "false"`` is its 400, not a stream), per request kind (other fields it ignores):
#: (the kinds, the type, how the error names it, an example).
_TYPED: dict[str, tuple[frozenset[str], type, str, str]] = {
    "stream": (frozenset({"chat", "generate"}), bool, "true or false", '"stream": false'),
    "raw": (frozenset({"generate"}), bool, "true or false", '"raw": true'),
    "truncate": (frozenset({"embed"}), bool, "true or false", '"truncate": true'),
    "tools": (
        frozenset({"chat"}),
        list,
        "a list of tools",
        '"tools": [{"type": "function", "function": {...}}]',
    ),
    "system": (frozenset({"generate"}), str, "a string", '"system": "You are terse."'),
    "suffix": (frozenset({"generate"}), str, "a string", '"suffix": "return x"'),
    "template": (frozenset({"generate"}), str, "a string", '"template": "{{ .Prompt }}"'),
}


def _check_types(kind: str, body: dict[str, Any]) -> None:
    for key, (kinds, cls, what, example) in _TYPED.items():
        value = body.get(key)
        if kind in kinds and value is not None and not isinstance(value, cls):
            raise UsageError(f'"{key}" must be {what}, not {json.dumps(value)[:40]}', hint=f"e.g. {example}")


def _may_control(request: Request, name: str, keep_alive: float | None) -> bool:
    """Whether the request's ``keep_alive`` applies: a model's TTL (and so its unload) is every
    tenant's, a control action, so only an admin key (or a service without keys) sets it. Any
    other key's TTL hints are ignored (its request is served as usual), and its ``keep_alive: 0``,
    an unload, is refused with a 403 naming the need for an admin key — before it counts
    against the key's limits."""
    key = request_key(request.scope)
    if key is None or key.admin:
        return True
    if keep_alive == 0:
        key.check_admin(f"unload model {name!r} (keep_alive: 0)")
    return False


def _keep_alive(b: OllamaBackend, name: str, seconds: float | None) -> None:
    """``keep_alive`` is a TTL hint, set by each request as in Ollama (a request without one
    clears it); the model's own ``ttl`` in forge.toml, when set, wins. Negative: never unload."""
    b.supervisor.hint_ttl(name, None if seconds is None or seconds < 0 else max(seconds, 0.01))


async def _load_or_unload(b: OllamaBackend, name: str, target: Target, generate: bool) -> Response:
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


class _OllamaAnswer:
    """llama-server's answer in Ollama's shape: a JSON object, or NDJSON lines as they complete.
    One per request: a stream's decoder and its gathered tool calls live here between chunks."""

    stream_type = "application/x-ndjson"
    whole_type = "application/json"

    def __init__(self, name: str, target: Target, started: float, generate: bool) -> None:
        self.name = name
        self.target = target
        self.started = started
        self.generate = generate
        self.over = False
        self._decoder = SSEDecoder()
        self._chat = ChatStream(name, started, generate=generate)

    def whole(self, content: bytes) -> bytes:
        data = json.loads(content)
        name, target, started = self.name, self.target, self.started
        reply: dict[str, Any]
        if target.kind == "embed":
            vectors = [d["embedding"] for d in sorted(data.get("data", []), key=lambda d: d.get("index", 0))]
            usage = data.get("usage") or {}
            reply = {
                "model": name,
                "embeddings": vectors,
                "total_duration": int((time.perf_counter() - started) * 1e9),
                "load_duration": 0,
                "prompt_eval_count": int(usage.get("prompt_tokens", 0) or 0),
            }
        elif target.kind == "embeddings":
            reply = {"embedding": data["data"][0]["embedding"]}
        elif target.kind == "native":
            reply = generate_reply(data, name, started)
        else:
            reply = chat_reply(data, name, started, generate=self.generate)
        # As starlette's JSONResponse wrote it before (Ollama's own answers are compact too).
        return json.dumps(reply, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()

    def feed(self, chunk: bytes) -> bytes:
        lines = b""
        for ev in self._decoder.feed(chunk):
            if self.over:
                break
            if ev.data == "[DONE]" and self.target.kind != "native":
                # The answer is whole: its last line goes out now, not when the child's response
                # ends (it may hold the connection a while after its last event).
                lines += _line(self._chat.finish())
                self.over = True
                break
            if not ev.data or ev.data == "[DONE]":
                continue
            data = json.loads(ev.data)
            if "error" in data:
                err = data["error"]
                lines += _line({"error": err.get("message") if isinstance(err, dict) else str(err)})
                self.over = True
            elif self.target.kind == "native":
                piece = native_piece(data, self.name, self.started)
                lines += _line(piece)
                self.over = bool(piece["done"])
            else:
                lines += b"".join(_line(obj) for obj in self._chat.feed(data))
        return lines

    def end(self) -> bytes:
        return b"" if self.target.kind == "native" else _line(self._chat.finish())


def _line(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode() + b"\n"


def routes(b: OllamaBackend) -> list[BaseRoute]:
    """The Ollama API's routes, each bound to ``b``."""

    def bound(handler: Callable[[OllamaBackend, Request], Awaitable[ASGIApp]]) -> Callable[[Request], Any]:
        return partial(handler, b)

    return [
        Route("/api/version", api_version, methods=["GET"], include_in_schema=False),
        Route("/api/tags", bound(api_tags), methods=["GET"], include_in_schema=False),
        Route("/api/show", bound(api_show), methods=["POST"], include_in_schema=False),
        Route("/api/ps", bound(api_ps), methods=["GET"], include_in_schema=False),
        *(
            Route(
                r.path,
                endpoint(r, OllamaAdapter(b, r.path.removeprefix("/api/"))),
                methods=[r.method],
                include_in_schema=False,
            )
            for r in OLLAMA_MODEL_ROUTES
        ),
        Route("/api/pull", api_pull, methods=["POST"], include_in_schema=False),
        *(
            Route(p, api_unsupported, methods=["POST", "DELETE"], include_in_schema=False)
            for p in ("/api/create", "/api/copy", "/api/push", "/api/delete")
        ),
    ]
