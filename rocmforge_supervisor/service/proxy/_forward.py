"""The model routes of OpenAI's and Anthropic's APIs and llama-server's own: their adapters to the
one ingress (``_ingress``), and ``/v1/models``.

Every route of the table :data:`~.._routes.FORWARDED` (every model route of the pinned
llama-server; a new one is a line there) is an endpoint of :func:`~._ingress.ingress` with one of
two adapters: :class:`JsonAdapter` (the model in the JSON body) or :class:`UploadAdapter` (a
multipart form field, or ``?model=``).

Nothing is translated for llama-server: it speaks OpenAI, Anthropic, Responses and its native
dialect itself, so the body goes through unchanged (unless a variant's rules or a default length
changed it) and the reply comes back unchanged, streams as the raw blocks that arrived. Only
Anthropic's Messages to a server of OpenAI chat alone (a command model, an OpenAI peer:
``_anthropic``) and OpenAI chat to a server of Messages alone (an Anthropic peer:
``_openai_upstream``) are translated, after the same checks, through the same forwarder with a
translator of the answer; a whisper model's audio upload becomes whisper-server's ``/inference``
(``_audio``).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from ..._errors import ForgeError, InvalidRequest
from ...config import ModelConfig
from ...supervisor import backend_of
from ..core._dialect import Translator
from ..core._names import ServedName, split_name
from ..core._recording import note_model, request_key
from ..core._routes import FORWARDED, ForwardRoute, model_from_request
from ..core._state import GatewayState, request_id, state_of
from ..edge._errors_http import error_response
from ._anthropic import AnthropicAnswer, chat_body, refuse_count_tokens, translates
from ._audio import audio_request, is_translation
from ._forwarder import open_upstream
from ._ingress import Intent, Outgoing, Target, endpoint
from ._listing import model_list
from ._openai_upstream import ChatAnswer, messages_body
from ._validate import check_fields, parse_object

__all__ = ["FORWARDED", "JsonAdapter", "UploadAdapter", "open_upstream", "routes"]

log = logging.getLogger("rocmforge.gateway")


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


class JsonAdapter:
    """OpenAI's and Anthropic's JSON routes (and llama-server's native ones): the body is
    llama-server's own dialect, sent as received unless a step changed it; Anthropic's Messages to
    a server of OpenAI chat only, and OpenAI chat to a server of Messages only, are translated."""

    remote_media = True
    keepalive = True

    async def read(self, st: GatewayState, route: ForwardRoute, request: Request, body: bytes) -> Intent:
        payload = parse_object(body)
        asked = payload.get("model")
        if not isinstance(asked, str) or not asked:
            raise InvalidRequest(
                'the request has no "model" field', param="model", hint="name one of GET /v1/models"
            )
        note_model(asked)  # a request refused for a field still names its model in the activity log
        shape = check_fields(payload, route.checks)
        return Intent(asked, payload.get("stream") is True, payload, tools=shape.tools, parts=shape.parts)

    def control(self, request: Request, served: ServedName, intent: Intent) -> None:
        return None

    def target(self, route: ForwardRoute, served: ServedName, intent: Intent) -> Target | None:
        assert intent.payload is not None
        return Target(route.path, intent.payload)

    async def outgoing(
        self,
        st: GatewayState,
        route: ForwardRoute,
        request: Request,
        served: ServedName,
        intent: Intent,
        body: bytes,
        target: Target | None,
    ) -> Outgoing | Response:
        assert target is not None
        content_type = request.headers.get("content-type", "application/json")
        translated: tuple[str, bytes, Translator] | None = None
        if route.dialect == "anthropic":  # checked in Anthropic's terms; then, where it must be, translated
            translated = _anthropic_to_chat(st, served.model, served.asked, route.path, target.payload)
        elif route.checks == "chat":  # OpenAI chat to a server of Anthropic's Messages only
            translated = _chat_to_messages(st, served.model, served.asked, target.payload)
        if translated is not None:
            path, translated_body, translator = translated
            return Outgoing(path, translated_body, content_type, translator)
        return Outgoing(_upstream_path(request), None, content_type)


class UploadAdapter:
    """The routes whose model is a form field (audio uploads) or ``?model=`` (``GET /props``,
    ``/slots``): nothing in the body is the gateway's to check but the model; a whisper model's
    upload is translated to whisper-server's ``/inference`` and its answer rendered back."""

    remote_media = True
    keepalive = True

    async def read(self, st: GatewayState, route: ForwardRoute, request: Request, body: bytes) -> Intent:
        asked, stream = await model_from_request(route, request, body)
        return Intent(asked, stream)

    def control(self, request: Request, served: ServedName, intent: Intent) -> None:
        return None

    def target(self, route: ForwardRoute, served: ServedName, intent: Intent) -> Target | None:
        return None

    async def outgoing(
        self,
        st: GatewayState,
        route: ForwardRoute,
        request: Request,
        served: ServedName,
        intent: Intent,
        body: bytes,
        target: Target | None,
    ) -> Outgoing | Response:
        content_type = request.headers.get("content-type", "application/json")
        if not backend_of(st.supervisor.config_of(served.model)).transcribes:
            if is_translation(route.path):
                raise InvalidRequest(
                    f"model {served.model!r} does not translate audio: translations need a "
                    'backend = "whisper" model',
                    param="model",
                    hint="name a whisper model of GET /v1/models",
                )
            return Outgoing(_upstream_path(request), body, content_type)
        # the audio adapter: the form as whisper-server's /inference, its answer rendered
        path, form, form_type, translator = await audio_request(
            request, body, route.path, st.server.audio_max_bytes
        )
        return Outgoing(path, form, form_type, translator)


def _upstream_path(request: Request) -> str:
    return request.url.path + (f"?{request.url.query}" if request.url.query else "")


_JSON, _UPLOAD = JsonAdapter(), UploadAdapter()


def routes() -> list[BaseRoute]:
    """``GET /v1/models`` and one endpoint per forwarded llama-server route."""
    out: list[BaseRoute] = [
        Route("/v1/models", _models, methods=["GET"]),
        Route("/v1/models/{model_id:path}", _model, methods=["GET"]),
    ]
    out += [
        Route(
            r.path,
            endpoint(r, _JSON if r.model_from == "json" else _UPLOAD),
            methods=[r.method],
            include_in_schema=False,
        )
        for r in FORWARDED
    ]
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
