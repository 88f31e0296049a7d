"""The model routes' ingress: a request's model, key, checks and rewrite, then the one forwarder
(``_forwarder``) to the server of the model it names.

One generic path for every route in the table :data:`~._routes.FORWARDED` (every model route of
the pinned llama-server; a new one is a line there) — find the model (JSON ``model``, a multipart
form field, or ``?model=``) → wait for its load, at most ``load_wait`` (then 503 + Retry-After +
progress) → ``supervisor.acquire`` (a slot, as an :class:`Upstream`) → ``client/_transport``
(retry on a stale keep-alive, httpx errors typed) → stream through or buffer → release.

Nothing is translated (but Anthropic's Messages to a command model whose server speaks only OpenAI
chat: ``_anthropic``, after the same checks, through the same forwarder with a translator of its
answer): the body goes through unchanged and the reply comes back unchanged, streams
as the raw blocks that arrived (a streamed request goes through the relay's own HTTP/1.1 client,
``_upstream_http``, with the same error mapping and retry rule; the rest through httpx), so every dialect llama-server speaks (OpenAI, Anthropic, Responses,
native) works with its own clients. Only the tail of a stream is kept, for the usage counters and
to notice a stream that ended without its last event; a child that dies mid-stream ends the
client's stream with an error event in the route's dialect. Streams that wait for their first
token get keep-alive comments; the answer goes out, and every error is rendered in the route's dialect, in
one place: the request's :class:`~._relay.RelayResponse`.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from ..._errors import (
    ForgeError,
    InvalidRequest,
)
from ...config import ModelConfig
from ...supervisor import backend_of
from ..core._dialect import DialectRequest, Translator
from ..core._names import ServedName, rewrite, split_name
from ..core._recording import (
    admit_model,
    note_model,
    request_key,
)
from ..core._routes import FORWARDED, Dialect, ForwardRoute, model_from_request
from ..core._state import GatewayState, body_limit, read_body, request_id, state_of
from ..edge._errors_http import error_response
from ._anthropic import AnthropicAnswer, chat_body, refuse_count_tokens, translates
from ._audio import audio_request, is_translation
from ._forwarder import Forwarder, open_upstream
from ._listing import check_media, check_tools, model_list
from ._openai_upstream import ChatAnswer, messages_body
from ._relay import RelayResponse
from ._tools import asks_for_tools
from ._validate import BodyShape, check_fields, default_length, parse_object, require_length

__all__ = ["FORWARDED", "open_upstream", "routes"]

log = logging.getLogger("rocmforge.gateway")


def _checked_json(
    st: GatewayState, route: ForwardRoute, body: bytes
) -> tuple[ServedName, bool, bytes, dict[str, Any], BodyShape]:
    """(served name, stream, body to send, parsed body, its shape) of a JSON request: the body parsed and its
    known fields checked (a 400 naming the field), a variant's or adapter's rules applied
    (``_names``), the model's ``max_tokens`` default set in the route's own length field when
    neither the request nor the variant gives a length — then, and only then, the body is
    re-serialized; otherwise it goes as received."""
    payload = parse_object(body)
    asked = payload.get("model")
    if not isinstance(asked, str) or not asked:
        raise InvalidRequest(
            'the request has no "model" field', param="model", hint="name one of GET /v1/models"
        )
    note_model(asked)  # a request refused for a field still names its model in the activity log
    shape = check_fields(payload, route.checks)
    served = split_name(asked, st.supervisor.names(), st.supervisor.config_of)
    default = st.supervisor.config_of(served.model).max_tokens  # 404 before queueing
    rewritten = rewrite(payload, served, anthropic=route.dialect == "anthropic", path=route.path)
    lengthened = default_length(payload, default, path=route.path)  # after the variant's: the nearer wins
    require_length(payload, route.path)
    if rewritten or lengthened:
        body = json.dumps(payload).encode()
    return served, payload.get("stream") is True, body, payload, shape


def forward_translated(st: GatewayState, req: DialectRequest) -> RelayResponse:
    """A request of a translated dialect (Ollama's ``/api/chat``…; the Ollama routes' one way to a
    model) through the one forwarder and the one relay response: the same load wait, slot,
    watchdog retry, metrics (under its endpoint), activity record and charge as every route."""
    route = ForwardRoute(req.endpoint, "POST", "json", "ollama")
    fwd = Forwarder(
        st,
        route,
        req.name,
        req.rid,
        time.perf_counter(),
        (req.upstream_path, req.body, "application/json"),
        retry=not req.stream,
        stream=req.stream,
        translator=req.translator,
    )
    fwd.asked = req.asked or req.name
    # No keep-alive pings (an NDJSON stream has no comment line); the connection is kept, as
    # Ollama keeps it.
    return RelayResponse(fwd.open, dialect="ollama", request_id=req.rid, stream=req.stream, interval=0.0)


#: Per (model, Anthropic route): whether its requests are translated to OpenAI chat, with the
#: configuration that was decided for (as :data:`_FITS`: a plain request does not ask again).
_TRANSLATED: dict[tuple[str, str], tuple[ModelConfig, bool]] = {}


def _anthropic_to_chat(
    st: GatewayState, name: str, asked: str, path: str, payload: dict[str, Any]
) -> tuple[str, bytes, Translator] | None:
    """An Anthropic request to a model whose server answers OpenAI chat and not ``path``
    (``_anthropic``): the chat route, the translated body and the answer's translator; None where
    the model answers ``path`` itself (llama-server: passed through). Its token count is a 400."""
    config = st.supervisor.config_of(name)
    known = _TRANSLATED.get((name, path))
    if known is None or known[0] is not config:
        refuse_count_tokens(name, config, path)
        known = _TRANSLATED[(name, path)] = (config, translates(config, path))
    if not known[1]:
        return None
    answer = AnthropicAnswer(asked, payload.get("stop_sequences"))
    return "/v1/chat/completions", json.dumps(chat_body(payload)).encode(), answer


#: Per model: whether its OpenAI chat requests are translated to Anthropic's Messages, with the
#: configuration that was decided for (as :data:`_TRANSLATED`).
_TO_MESSAGES: dict[str, tuple[ModelConfig, bool]] = {}


def _chat_to_messages(
    st: GatewayState, name: str, asked: str, payload: dict[str, Any]
) -> tuple[str, bytes, Translator] | None:
    """An OpenAI chat request to a model whose server answers Anthropic's Messages and not OpenAI
    chat (a peer with ``api = "anthropic"``): the Messages route, the translated body and the
    answer's translator (``_openai_upstream``); None where the model answers chat itself."""
    config = st.supervisor.config_of(name)
    known = _TO_MESSAGES.get(name)
    if known is None or known[0] is not config:
        backend = backend_of(config)
        to_messages = not backend.serves(config, "/v1/chat/completions") and backend.serves(
            config, "/v1/messages"
        )
        known = _TO_MESSAGES[name] = (config, to_messages)
    if not known[1]:
        return None
    return "/v1/messages", json.dumps(messages_body(payload)).encode(), ChatAnswer(asked)


def _endpoint(route: ForwardRoute) -> Callable[[Request], Any]:
    dialect: Dialect = route.dialect

    async def forward(request: Request) -> Any:
        st = state_of(request)
        rid = request_id(request)
        received = time.perf_counter()
        content_type = request.headers.get("content-type", "application/json")
        whisper = False
        translated: tuple[str, bytes, Translator] | None = None
        try:
            body = await read_body(request, body_limit(st, route.path)) if route.method == "POST" else b""
            if route.model_from == "json":
                served, stream, body, payload, shape = _checked_json(st, route, body)
                name = served.model
                # the key's models (it may name a variant): 403 first
                admit_model(request.scope, served.asked, stream=stream)
                # Only the checks the body's shape calls for: a text chat meets neither.
                if shape.tools and asks_for_tools(payload):
                    await check_tools(request.app.state.ollama, name, payload)
                if shape.parts:
                    check_media(st.supervisor, name, payload, allow_remote=st.server.allow_remote_media)
                if dialect == "anthropic":  # checked in Anthropic's terms; then, where it must be, translated
                    translated = _anthropic_to_chat(st, name, served.asked, route.path, payload)
                elif route.checks == "chat":  # OpenAI chat to a server of Anthropic's Messages only
                    translated = _chat_to_messages(st, name, served.asked, payload)
            else:
                asked, stream = await model_from_request(route, request, body)
                served = split_name(asked, st.supervisor.names(), st.supervisor.config_of)
                name = served.model  # a form or query has no body to rewrite: the model's child
                config = st.supervisor.config_of(name)  # 404 before queueing
                admit_model(request.scope, served.asked, stream=stream)  # the key's models: 403 first
                whisper = backend_of(config).transcribes
                if not whisper and is_translation(route.path):
                    raise InvalidRequest(
                        f"model {name!r} does not translate audio: translations need a "
                        'backend = "whisper" model',
                        param="model",
                        hint="name a whisper model of GET /v1/models",
                    )
        except ForgeError as exc:
            st.metrics.errors.labels("-", type(exc).__name__).inc()
            return error_response(exc, rid, dialect)
        translator: Translator | None = None
        path = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        if translated is not None:  # Anthropic's Messages to a server of OpenAI chat only
            path, body, translator = translated
        if whisper:  # the audio adapter: the form as whisper-server's /inference, its answer rendered
            try:
                path, body, content_type, translator = await audio_request(
                    request, body, route.path, st.server.audio_max_bytes
                )
            except ForgeError as exc:
                return error_response(exc, rid, dialect)
        fwd = Forwarder(
            st,
            route,
            name,
            rid,
            received,
            (path, body, content_type),
            retry=not stream,
            stream=stream,
            translator=translator,
        )
        fwd.asked = served.asked
        return RelayResponse(
            fwd.open,
            dialect=dialect,
            request_id=rid,
            stream=stream,
            interval=st.server.sse_keepalive,
            close=stream and not st.server.keep_alive_streams,
        )

    forward.__name__ = f"forward_{route.path.strip('/').replace('/', '_').replace('-', '_')}"
    return forward


def routes() -> list[BaseRoute]:
    """``GET /v1/models`` and one endpoint per forwarded llama-server route."""
    out: list[BaseRoute] = [
        Route("/v1/models", _models, methods=["GET"]),
        Route("/v1/models/{model_id:path}", _model, methods=["GET"]),
    ]
    out += [Route(r.path, _endpoint(r), methods=[r.method], include_in_schema=False) for r in FORWARDED]
    return out


async def _models(request: Request) -> Response:
    """OpenAI's list shape, each model with ``state``, ``context_length`` and ``capabilities``."""
    st = state_of(request)
    data = await model_list(request.app.state.ollama, st.supervisor.started_at, request.scope)
    return JSONResponse({"object": "list", "data": data})


async def _model(request: Request) -> Response:
    """OpenAI's retrieve-model (clients check a name with it first): one entry of the list."""
    st = state_of(request)
    asked = request.path_params["model_id"]
    try:
        served = split_name(asked, st.supervisor.names(), st.supervisor.config_of)
        st.supervisor.view(served.model)
        name = served.asked
        if (key := request_key(request.scope)) is not None:
            key.check_model(name)  # a 403 naming the key's models, as a request to it would be
    except ForgeError as exc:
        return error_response(exc, request_id(request))
    for entry in await model_list(request.app.state.ollama, st.supervisor.started_at):
        if entry.get("id") == name:
            return JSONResponse(entry)
    return JSONResponse({"id": name, "object": "model", "owned_by": "rocmforge"})
