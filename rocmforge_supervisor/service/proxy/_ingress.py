"""The one ingress: every model request, in every dialect, is prepared here in one order.

OpenAI's and Anthropic's JSON routes, the audio uploads and ``?model=`` reads, and Ollama's
``/api/chat``, ``/generate``, ``/embed`` and ``/embeddings`` all run :func:`ingress`:

    body read (its route's limit) → the dialect reads it: the model it names, a stream or not,
    its fields checked in the dialect's own terms (400) → the model noted for the activity row →
    the name resolved (a variant, an adapter, ``:latest``; 404 before anything waits) → the
    dialect's control check (Ollama's ``keep_alive: 0`` is an unload, an admin's act: 403) → the
    key's scope, then its limits and the request's priority class (403, 429) → tools the model
    cannot use (400) → the request in the child's terms (Ollama's translated here) → a variant's
    rules and an adapter's ``lora`` → media the model cannot take (400) → the model's
    ``max_tokens`` default in the child route's own length field, and a length the route's API
    requires (400) → the dialect's last word (Ollama's empty prompt loads or unloads the model; its
    ``num_ctx`` against the served context; Anthropic's Messages to a server of OpenAI chat only,
    translated) → the one forwarder and the one relay response.

What differs between dialects is an :class:`Adapter` (how a request is read, what it becomes for
the child, how its answer is translated); the order, the checks and what they refuse with are
the same for all, and a check added here is met by every dialect. Errors are rendered once, in the
route's dialect (``_errors_http``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp

from ..._errors import ForgeError
from ..core._dialect import Translator
from ..core._names import ServedName, rewrite, split_name
from ..core._recording import admit_model, note_model
from ..core._routes import ForwardRoute
from ..core._state import GatewayState, body_limit, read_body, request_id, state_of
from ..edge._errors_http import error_response
from ._forwarder import Forwarder
from ._listing import check_media, check_tools
from ._relay import RelayResponse
from ._tools import asks_for_tools
from ._validate import default_length, has_parts, require_length

__all__ = ["Adapter", "Intent", "Outgoing", "Target", "endpoint", "ingress"]


@dataclass
class Intent:
    """A request as its dialect read it: what every later step needs to know of it."""

    asked: str
    """The model as the client named it (before a variant, an adapter or ``:latest`` is resolved)."""
    stream: bool
    payload: dict[str, Any] | None = None
    """The JSON body, in the dialect's own terms; None for a form upload or a ``?model=`` read
    (sent as received: nothing in it is the gateway's to check)."""
    tools: bool = False
    """The body's shape calls for the tools check (its dialect sends tools there)."""
    parts: bool | None = None
    """The body has content parts (images, audio) for the media check; None: look."""
    length_given: bool = False
    """The client bounded the answer in its dialect's own terms, even as "no limit" (Ollama's
    ``num_predict: -1``): the model's ``max_tokens`` default does not apply."""


@dataclass
class Target:
    """The request in the child's terms: its route and JSON body (changed by the later steps)."""

    path: str
    payload: dict[str, Any]
    changed: bool = False
    """The body differs from what arrived (translated, a variant's rules, a default length): it
    is serialized again; otherwise the received bytes go as they are."""


@dataclass
class Outgoing:
    """What the forwarder sends, and how the answer comes back."""

    path: str
    body: bytes | None
    """None: the JSON request as the steps left it (the received bytes, unless a step changed it)."""
    content_type: str
    translator: Translator | None = None


class Adapter(Protocol):
    """A dialect on the request's side: what differs between OpenAI, Anthropic, Ollama and the
    audio uploads. Called down from :func:`ingress`, in its order; never calls back up."""

    #: Let remote (``http(s)://``) media URLs through where ``server.allow_remote_media`` says so
    #: (Ollama sends images as base64 only).
    remote_media: bool
    #: Keep-alive comments while a stream waits for its first token (``server.sse_keepalive``),
    #: and ``server.keep_alive_streams``: not where the stream has no comment line (Ollama's NDJSON;
    #: its connection is kept, as Ollama keeps it).
    keepalive: bool

    async def read(self, st: GatewayState, route: ForwardRoute, request: Request, body: bytes) -> Intent:
        """The request as the dialect reads it (a 400 in its terms for a malformed one)."""
        ...

    def control(self, request: Request, served: ServedName, intent: Intent) -> None:
        """A check before the key's admission (Ollama's unload by ``keep_alive: 0``)."""
        ...

    def target(self, route: ForwardRoute, served: ServedName, intent: Intent) -> Target | None:
        """The JSON request in the child's terms; None where nothing is JSON (a form, a query)."""
        ...

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
        """What goes to the child (a translation the model's server needs), or an answer of the
        dialect's own without the child (Ollama's load or unload by an empty prompt)."""
        ...


async def ingress(route: ForwardRoute, adapter: Adapter, request: Request) -> ASGIApp:
    """The one preparation of a model request (the module's docstring says its order), then the
    one forwarder. Every refusal is one error in the route's dialect."""
    st = state_of(request)
    rid = request_id(request)
    received = time.perf_counter()
    try:
        body = await read_body(request, body_limit(st, route.path)) if route.method == "POST" else b""
        intent = await adapter.read(st, route, request, body)
        note_model(intent.asked, stream=intent.stream)  # a refused request still names its model
        served = split_name(intent.asked, st.supervisor.names(), st.supervisor.config_of)
        config = st.supervisor.config_of(served.model)  # 404 before anything waits
        adapter.control(request, served, intent)
        admit_model(request.scope, served.asked, stream=intent.stream)  # the key's models, limits: 403, 429
        if intent.tools and intent.payload is not None and asks_for_tools(intent.payload):
            await check_tools(request.app.state.ollama, served.model, intent.payload)
        target = adapter.target(route, served, intent)
        if target is not None:
            payload = target.payload
            anthropic = route.dialect == "anthropic"
            target.changed |= rewrite(payload, served, anthropic=anthropic, path=target.path)
            parts = intent.parts if intent.parts is not None and not target.changed else has_parts(payload)
            if parts:
                remote = adapter.remote_media and st.server.allow_remote_media
                check_media(st.supervisor, served.model, payload, allow_remote=remote)
            if not intent.length_given:  # after the variant's: the nearer default wins
                target.changed |= default_length(payload, config.max_tokens, path=target.path)
            require_length(payload, target.path)
        out = await adapter.outgoing(st, route, request, served, intent, body, target)
    except ForgeError as exc:
        st.metrics.errors.labels("-", type(exc).__name__).inc()
        return error_response(exc, rid, route.dialect)
    if isinstance(out, Response):
        return out
    sent = out.body
    if sent is None:
        sent = json.dumps(target.payload).encode() if target is not None and target.changed else body
    fwd = Forwarder(
        st,
        route,
        served.model,
        rid,
        received,
        (out.path, sent, out.content_type),
        retry=not intent.stream,
        stream=intent.stream,
        translator=out.translator,
    )
    fwd.asked = served.asked
    return RelayResponse(
        fwd.open,
        dialect=route.dialect,
        request_id=rid,
        stream=intent.stream,
        interval=st.server.sse_keepalive if adapter.keepalive else 0.0,
        close=intent.stream and adapter.keepalive and not st.server.keep_alive_streams,
    )


def endpoint(route: ForwardRoute, adapter: Adapter) -> Callable[[Request], Any]:
    """The starlette endpoint of ``route``: :func:`ingress` with the dialect's adapter."""

    async def forward(request: Request) -> ASGIApp:
        return await ingress(route, adapter, request)

    forward.__name__ = f"forward_{route.path.strip('/').replace('/', '_').replace('-', '_')}"
    return forward
