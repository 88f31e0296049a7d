"""The gateway's edge: CORS as the running config says (:class:`LiveCors`), then its checks, as one
plain ASGI middleware (no per-request task or body copy).

Request id (``X-Request-ID``, made up when absent), bearer auth (which key, admin for the control
routes; the key's limits count once the route knows the request's model: ``_recording``), the
CSRF Origin check, the declared body size and the body's media type; and the activity record of
every model request, written here once when its response ends (``_recording``). Each check *raises* a typed error (``Unauthorized``,
``Forbidden``, ``PayloadTooLarge``, ``UnsupportedMediaType``); ``_errors_http`` alone turns it
into a response. A body without a ``Content-Length`` (chunked) is counted by ``_state.read_body``
and gets the same 413.

**Media type (415).** The JSON routes parse the body whatever its ``Content-Type`` says, so
without this check an HTML form on any web site could post JSON to them: a ``text/plain`` form
sends its fields unencoded (``<input name='{"model":"m","prompt":"' value='"}'>`` is a JSON
body), and a browser that sends no ``Origin`` with it gets past the Origin check. So a JSON
route takes ``application/json`` (or ``application/*+json``), or no ``Content-Type`` at all
(a form always sends one; ``fetch`` without one always sends ``Origin``). One exception, for
curl: ``curl -d '{...}'`` labels its body ``application/x-www-form-urlencoded``, and Ollama's
own documentation (and Ollama, which ignores the label) posts that way. A form cannot forge such
a body, since it percent-encodes ``{``, ``[`` and ``"``; so that label is accepted when the
body's first non-blank byte opens a JSON object or array. Everything else (``text/plain``,
``multipart/form-data``, a form-encoded ``a=b``, an empty form body) is a 415 naming the fix.
"""

from __future__ import annotations

import ipaddress
import re
import secrets
from urllib.parse import urlsplit

from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..._errors import Forbidden, ForgeError, Unauthorized, UnsupportedMediaType
from ...config import is_loopback
from ..core import _recording
from ..core._logging import request_id_var
from ..core._routes import MODEL_PATHS, OLLAMA_MODEL_USE, auth_hint, dialect_for_path, takes_json
from ..core._state import GatewayState, body_limit, too_large
from ..core._visibility import ModelScope, request_scope
from ._errors_http import error_response

__all__ = ["LiveCors", "RequestContext", "same_origin"]

# Probes (a Kubernetes kubelet, a load balancer) cannot send the key: /ready answers status only.
# The app adds the status page's files (they hold no data): ``RequestContext(public_paths=…)``.
_PUBLIC_PATHS = frozenset({"/health", "/ready"})
_SAFE_METHODS = ("GET", "HEAD", "OPTIONS")
_JSON_MEDIA = re.compile(r"application/(?:[\w.-]+\+)?json")
_CURL_DEFAULT = "application/x-www-form-urlencoded"


def _needs_admin(method: str, path: str) -> bool:
    """The control routes (add, load, unload, reload, pull, …) and so the page's controls: every
    write under /api/ except the Ollama routes that use a model."""
    return method not in _SAFE_METHODS and path.startswith("/api/") and path not in OLLAMA_MODEL_USE


def same_origin(scope: Scope, origin: str, *, keyed: bool) -> bool:
    """The request comes from a page of this very service (the status page opened at a LAN
    address), so it is no cross-site request.

    The Host header is the browser's, and a DNS-rebinding page can make its own name point here:
    so a host *name* only counts when an API key guards the service (that page has no key); an IP
    address cannot be rebound and always counts.
    """
    host = next((v for k, v in scope["headers"] if k == b"host"), b"").decode("latin-1")
    if not host or origin != f"{scope.get('scheme', 'http')}://{host}":
        return False
    if keyed:
        return True
    try:
        ipaddress.ip_address((urlsplit(origin).hostname or "").strip("[]"))
    except ValueError:
        return False
    return True


class LiveCors:
    """Starlette's CORS middleware for ``server.cors_origins`` as the running config says: rebuilt
    when a reload changes the list (the list is compared by identity: a reload swaps the section),
    absent while the list is empty."""

    def __init__(self, app: ASGIApp, state: GatewayState) -> None:
        self.app = app
        self.state = state
        self._origins: list[str] | None = None
        self._cors: ASGIApp = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        origins = self.state.server.cors_origins
        if origins is not self._origins:
            self._origins = origins
            self._cors = (
                CORSMiddleware(self.app, allow_origins=origins, allow_methods=["*"], allow_headers=["*"])
                if origins
                else self.app
            )
        await self._cors(scope, receive, send)


class RequestContext:
    """Request id on every response; auth, Origin and size checked before any route runs."""

    def __init__(self, app: ASGIApp, state: GatewayState, public_paths: frozenset[str] = frozenset()) -> None:
        self.public_paths = _PUBLIC_PATHS | public_paths
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        rid = headers.get(b"x-request-id", b"").decode("latin-1")[:128] or secrets.token_hex(8)
        scope.setdefault("state", {})["request_id"] = rid
        request_id_var.set(rid)
        request_scope.set(None)  # until a key is identified (``_check``)
        rid_header = (b"x-request-id", rid.encode())
        recorder = self.state.recorder
        recorder.follow(self.state.supervisor.config)
        if scope["path"] not in MODEL_PATHS:
            wire = _recording.Wire(send, receive, rid_header)
            checked = await self._checked(scope, headers, None, receive, wire.send)
            if checked is not None:
                await self.app(scope, checked, wire.send)
            return
        await self._recorded(scope, receive, send, headers, rid, rid_header)

    async def _recorded(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        headers: dict[bytes, bytes],
        rid: str,
        rid_header: tuple[bytes, bytes],
    ) -> None:
        """A model request: the same checks, with its activity record opened here and written
        when the response has ended (or failed, or the client left: the :class:`Wire` says which).
        One wrapper of ``send`` (the request id too): it runs for every chunk of every stream."""
        recorder = self.state.recorder
        draft = recorder.begin(scope, rid)
        wire = _recording.Wire(send, receive, rid_header, recorder, draft)
        try:
            checked = await self._checked(scope, headers, draft, receive, wire.send)
            if checked is None:
                return
            wire.source = checked  # what the capture reads from too
            await self.app(scope, wire.receive if draft.capture else checked, wire.send)
        finally:
            recorder.finish(draft, wire.status, completed=wire.completed)
            _recording.current.set(None)

    async def _checked(
        self,
        scope: Scope,
        headers: dict[bytes, bytes],
        draft: _recording.Draft | None,
        receive: Receive,
        send: Send,
    ) -> Receive | None:
        """Every edge check, for a model request and any other alike: the ``receive`` the app must
        read the body from, or None when a check refused the request and its error has been sent
        (in the route's dialect)."""
        try:
            self._check(scope, headers, draft)
            return await _check_media_type(scope, headers, receive)
        except ForgeError as exc:
            await error_response(exc, dialect=dialect_for_path(scope["path"]))(scope, receive, send)
            return None

    def _check(self, scope: Scope, headers: dict[bytes, bytes], draft: _recording.Draft | None) -> None:
        method = scope["method"]
        path = scope["path"]
        keys = self.state.recorder.keys
        public = path in self.public_paths or (
            path == "/metrics" and self.state.server.metrics_public
        )  # reloadable
        # A key sent to a public /metrics still counts: a key that is not an admin sees its own
        # per-key series there as everywhere (an anonymous caller sees none: ``_observe``).
        if keys and method != "OPTIONS" and (not public or path == "/metrics"):
            auth = headers.get(b"authorization", b"")
            token = auth[7:] if auth[:7].lower() == b"bearer " else headers.get(b"x-api-key", b"")
            key = keys.identify(token)
            if key is None and not public:
                raise Unauthorized("missing or invalid API key", hint=auth_hint(path))
            if key is not None:
                scope.setdefault("state", {})["key"] = key
                self.state.recorder.identified(draft, key)
                # What its errors may name (``_errors_http``): a scoped key, its models only.
                request_scope.set(None if key.admin else ModelScope(key, self.state.supervisor))
                if _needs_admin(method, path):
                    key.check_admin(f"{method} {path}")
        if draft is not None:  # a model request: its admission class (400/403 for a bad header)
            asked = headers.get(b"x-priority")
            _recording.note_priority(draft, draft.key, asked.decode("latin-1") if asked is not None else None)
        origin = headers.get(b"origin")
        if origin is not None and method not in _SAFE_METHODS and not self._origin_ok(origin, scope):
            # A web page must not drive the local service (CSRF): browsers send Origin on such
            # requests; tools (curl, SDKs) do not.
            raise Forbidden(
                "cross-origin request refused", hint="add the page's origin to server.cors_origins"
            )
        length = headers.get(b"content-length")
        limit = body_limit(self.state, path)
        if length is not None and length.isdigit() and int(length) > limit:
            raise too_large(limit, path)
        # The key's limits count a model request once its model is known and allowed
        # (``_recording.admit_model``): a request refused here or there costs no budget.

    def _origin_ok(self, origin: bytes, scope: Scope) -> bool:
        text = origin.decode("latin-1")
        if text in self.state.server.cors_origins or is_loopback(urlsplit(text).hostname or ""):
            return True
        return same_origin(
            scope, text, keyed=bool(self.state.recorder.keys)
        )  # the status page at a LAN address


async def _check_media_type(scope: Scope, headers: dict[bytes, bytes], receive: Receive) -> Receive:
    """The 415 rule of the module docstring; returns the ``receive`` the app must read the body
    from (a replay of what was peeked at, for curl's form-encoded label)."""
    raw = headers.get(b"content-type")
    if raw is None or not takes_json(scope["method"], scope["path"]):
        return receive
    media = raw.split(b";", 1)[0].strip().decode("latin-1").lower()
    if _JSON_MEDIA.fullmatch(media):
        return receive
    if media == _CURL_DEFAULT:
        peeked, replay = await _peek_first_byte(receive)
        if peeked in (b"{", b"["):
            return replay
    what = f"{media} body" if media != _CURL_DEFAULT else "form-encoded body that is not JSON"
    raise UnsupportedMediaType(
        f"{scope['method']} {scope['path']} takes a JSON body, not a {what}",
        hint="send Content-Type: application/json (curl: -H 'Content-Type: application/json' -d BODY)",
    )


async def _peek_first_byte(receive: Receive) -> tuple[bytes, Receive]:
    """The body's first non-blank byte (b"" for a blank body), and a ``receive`` that replays the
    messages read to find it before passing on to the real one."""
    seen: list[Message] = []
    first = b""
    while True:
        message = await receive()
        seen.append(message)
        if message["type"] != "http.request":
            break
        first = message.get("body", b"").lstrip(b" \t\r\n")[:1]
        if first or not message.get("more_body", False):
            break

    async def replay() -> Message:
        return seen.pop(0) if seen else await receive()

    return first, replay
