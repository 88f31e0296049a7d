"""The model routes' table: every llama-server route the gateway forwards, with all it is in one
row (how it names its model, its dialect, its body's checks, its length field, its stream's end
marker, reranking, audio) — the other modules read these columns, not lists of their own.

The list is the pinned llama-server's (``tools/server/server.cpp`` at 4df29be, the same set its
own router mode forwards): every route that takes a model. Nothing is translated for llama-server
— it already speaks OpenAI, Anthropic and its native dialect, and a translator loses fields
(Lemonade's Anthropic translation dropped what Claude Code sends: lemonade#2662); only a command
model whose server speaks OpenAI chat alone gets ``/v1/messages`` translated (``proxy/_anthropic``). The gateway only has to find
the model: in the JSON body's ``model``, in the multipart form field ``model`` (audio
transcriptions), or in ``?model=`` (``GET /props``, ``GET /slots``).

The dialect picks the shape of the gateway's *own* errors on that route (a 404 for an unknown
model, a 503 while loading, a 401): Anthropic clients parse ``{"type":"error","error":{…}}``,
Ollama clients ``{"error":"…"}``, everyone else OpenAI's ``{"error":{"message",…}}``.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Literal

from starlette.requests import Request

from ..._errors import UsageError

__all__ = [
    "FORWARDED",
    "MODEL_PATHS",
    "MODEL_ROUTES",
    "OLLAMA_MODEL_ROUTES",
    "OLLAMA_MODEL_USE",
    "OLLAMA_PATHS",
    "ROUTE_OF",
    "Dialect",
    "ForwardRoute",
    "dialect_for_path",
    "model_from_request",
    "replayed",
    "resolve_name",
    "route_of",
    "takes_json",
]

Dialect = Literal["openai", "anthropic", "ollama"]
ModelFrom = Literal["json", "form", "query"]


#: Which field checks (``proxy/_validate.CHECKS``) a JSON route gets; "" checks only ``model``.
Checks = Literal["", "chat", "completion", "embedding", "messages"]
#: What an audio upload route asks of a whisper model.
Audio = Literal["", "transcribe", "translate"]


@dataclass(frozen=True)
class ForwardRoute:
    """One model route of the gateway, all it is in one row: where its model is named, its
    dialect, the checks its body gets, the field that bounds its answer, what ends a complete
    stream of it, whether it reranks or uploads audio. Every part of the gateway that treats a
    route in its own way reads it here (the scope matrix adds who may see it: a model route's
    answer is about the model it names)."""

    path: str
    method: Literal["GET", "POST"] = "POST"
    model_from: ModelFrom = "json"
    dialect: Dialect = "openai"
    checks: Checks = ""
    #: The field its API bounds an answer's length with (None: it generates no text).
    length: str | None = None
    #: What the last event of a complete stream contains (a stream that ends without it was cut).
    end_marker: bytes | None = None
    rerank: bool = False
    audio: Audio = ""

    @property
    def generates(self) -> bool:
        """It generates text (a reranker refuses it; a generating model refuses reranking)."""
        return self.length is not None


_route = ForwardRoute
_DONE = b"[DONE]"


def _chat(path: str) -> ForwardRoute:
    return ForwardRoute(path, checks="chat", length="max_tokens", end_marker=_DONE)


def _native(path: str) -> ForwardRoute:
    """llama-server's own completion routes."""
    return ForwardRoute(path, length="n_predict", end_marker=b'"stop":true')


def _responses(path: str) -> ForwardRoute:
    return ForwardRoute(path, length="max_output_tokens", end_marker=b"response.completed")


#: Every model route of the pinned llama-server, forwarded as-is to the named model's child: the
#: one table of the model routes.
FORWARDED: tuple[ForwardRoute, ...] = (
    _chat("/v1/chat/completions"),
    _chat("/chat/completions"),
    _route("/v1/completions", checks="completion", length="max_tokens", end_marker=_DONE),
    _native("/completions"),  # llama-server's native route, as /completion
    _native("/completion"),
    _route("/v1/chat/completions/input_tokens"),
    _route("/chat/completions/input_tokens"),
    _responses("/v1/responses"),
    _responses("/responses"),
    _route("/v1/responses/input_tokens"),
    _route("/responses/input_tokens"),
    _route("/v1/messages", dialect="anthropic", checks="messages", length="max_tokens", end_marker=b"message_stop"),
    _route("/v1/messages/count_tokens", dialect="anthropic"),
    _route("/v1/embeddings", checks="embedding"),
    _route("/embeddings"),
    _route("/embedding"),
    *(_route(p, rerank=True) for p in ("/v1/rerank", "/v1/reranking", "/rerank", "/reranking")),
    _native("/infill"),
    _route("/tokenize"),
    _route("/detokenize"),
    _route("/apply-template"),
    _route("/v1/audio/transcriptions", model_from="form", end_marker=_DONE, audio="transcribe"),
    _route("/audio/transcriptions", model_from="form", end_marker=_DONE, audio="transcribe"),
    # whisper models only (backend = "whisper": service/proxy/_audio translates both audio routes)
    _route("/v1/audio/translations", model_from="form", audio="translate"),
    _route("/audio/translations", model_from="form", audio="translate"),
    _route("/props", method="GET", model_from="query"),
    _route("/slots", method="GET", model_from="query"),
)  # fmt: skip

#: Ollama's model routes: its adapter (``ollama/``) turns each request into one of the rows above
#: (``/api/chat`` into OpenAI chat, ``/api/generate`` into chat, ``/completion`` or ``/infill``,
#: ``/api/embed`` into embeddings), then the same ingress and forwarder as every route.
OLLAMA_MODEL_ROUTES: tuple[ForwardRoute, ...] = tuple(
    ForwardRoute(path, dialect="ollama")
    for path in ("/api/chat", "/api/generate", "/api/embed", "/api/embeddings")
)

#: Every route that uses a model, in every dialect: one ingress each (``proxy/_ingress``).
MODEL_ROUTES: tuple[ForwardRoute, ...] = FORWARDED + OLLAMA_MODEL_ROUTES

#: The model routes by path (each path is one route: one method).
ROUTE_OF: Mapping[str, ForwardRoute] = {r.path: r for r in FORWARDED}


def route_of(path: str) -> ForwardRoute | None:
    """The model route at ``path`` (an upstream path: its query ignored); None for another."""
    return ROUTE_OF.get(path.partition("?")[0])


#: The Ollama API's paths (Ollama's own server has these under /api; the control API keeps its
#: paths — /api/models, /api/events, /api/reload, /api/openapi.json — which Ollama does not use).
OLLAMA_PATHS = frozenset(
    {
        "/api/version",
        "/api/tags",
        "/api/show",
        "/api/ps",
        "/api/chat",
        "/api/generate",
        "/api/embed",
        "/api/embeddings",
        "/api/pull",
        "/api/create",
        "/api/copy",
        "/api/push",
        "/api/delete",
        "/api/blobs",
    }
)

#: The Ollama routes that use a model (any key may call them; the other writes under /api/ are
#: control routes, for admin keys).
OLLAMA_MODEL_USE = frozenset(r.path for r in OLLAMA_MODEL_ROUTES) | {"/api/show"}
#: The requests that get an activity record and count against a key's limits: every model route.
MODEL_PATHS = frozenset(r.path for r in MODEL_ROUTES)

_ANTHROPIC_PATHS = frozenset(r.path for r in FORWARDED if r.dialect == "anthropic")

#: The routes whose body is a JSON document: the forwarded model routes (not the multipart audio
#: upload), Ollama's (not its binary blob upload) and the control API's writes.
_JSON_BODY_PATHS = frozenset(
    {r.path for r in FORWARDED if r.method == "POST" and r.model_from == "json"}
    | (OLLAMA_PATHS - {"/api/version", "/api/tags", "/api/ps", "/api/blobs"})
    | {"/api/models", "/api/reload"}
)


def takes_json(method: str, path: str) -> bool:
    """Whether a request's body must be JSON (checked by the middleware's Content-Type rule)."""
    if method in ("GET", "HEAD", "OPTIONS"):
        return False
    if path in _JSON_BODY_PATHS:
        return True
    return path.startswith("/api/models/") and path.endswith(("/load", "/unload"))


def dialect_for_path(path: str) -> Dialect:
    """The error shape a client of this path expects (used by the middleware's own 401/403/413)."""
    if path in _ANTHROPIC_PATHS:
        return "anthropic"
    if path in OLLAMA_PATHS or path.startswith("/api/blobs/"):
        return "ollama"
    return "openai"


def auth_hint(path: str) -> str:
    """How to send the key, in the 401: Anthropic's clients send ``x-api-key`` (the middleware
    takes it on every route), the others a Bearer token."""
    if dialect_for_path(path) == "anthropic":
        return "send x-api-key: KEY (or Authorization: Bearer KEY)"
    return "send Authorization: Bearer KEY"


async def model_from_request(route: ForwardRoute, request: Request, body: bytes) -> tuple[str, bool]:
    """The model a forwarded request names and whether it asks for a stream (the body is parsed
    once); :class:`UsageError` (400) when it names no model."""
    if route.model_from == "query":
        name = request.query_params.get("model")
        if not name:
            raise UsageError(
                f"GET {route.path} needs ?model=NAME", hint="name one of GET /v1/models, e.g. ?model=gemma"
            )
        return name, False
    if route.model_from == "form":
        fields = await _form_fields(request, body, ("model", "stream"))
        found, stream = fields["model"], fields["stream"] == "true"
    else:
        try:
            payload = json.loads(body)
        except ValueError:
            raise UsageError("the request body is not valid JSON", hint="send a JSON object") from None
        found = payload.get("model") if isinstance(payload, dict) else None
        stream = isinstance(payload, dict) and payload.get("stream") is True
    if not isinstance(found, str) or not found:
        where = "form field" if route.model_from == "form" else "field"
        raise UsageError(f'the request has no "model" {where}', hint="name one of GET /v1/models")
    return found, stream


def replayed(request: Request, body: bytes) -> Request:
    """``request`` again, over a body already read into ``body``: for starlette's form parser
    (python-multipart) after the body was read whole (its size checked), so the original bytes
    can still be forwarded unchanged."""
    sent = False

    async def replay() -> dict[str, object]:
        nonlocal sent
        if sent:
            return {"type": "http.request", "body": b"", "more_body": False}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return Request(request.scope, replay)


async def _form_fields(request: Request, body: bytes, names: tuple[str, ...]) -> dict[str, str | None]:
    """Text fields of a multipart or urlencoded body that was already read into ``body``.

    Parsed by starlette's form parser (python-multipart) over a replay of the bytes, so the
    original body is forwarded unchanged.
    """
    try:
        async with replayed(request, body).form() as form:
            values = {n: form.get(n) for n in names}
    except (AssertionError, ValueError, KeyError) as exc:
        raise UsageError(
            f"the form body could not be parsed: {exc}", hint="send multipart/form-data"
        ) from None
    return {n: v if isinstance(v, str) else None for n, v in values.items()}


def resolve_name(name: str, known: Collection[str]) -> str:
    """Ollama clients name models ``NAME:latest``; the service knows them as ``NAME``.

    Applied on every model route, not only Ollama's: OpenAI and Anthropic clients have been served
    ``model="NAME:latest"`` since the Ollama API came (a client may list models in one dialect and
    send in another), so narrowing it would break them. A name the service knows exactly always
    wins, so the rule never hides a model really called ``…:latest``."""
    if name in known:
        return name
    if name.endswith(":latest") and name[: -len(":latest")] in known:
        return name[: -len(":latest")]
    return name
