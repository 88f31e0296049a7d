"""Who sees what: every route's visibility class, and the one rule for "may this key see model X".

A key scoped to some models (``[[server.keys]]`` with ``models = [...]``) must learn nothing of
the others on any route: not in a listing, an event, a metric, a device's holders, an error's
hint. :data:`ROUTES` gives every route the app serves one class (:class:`Visibility`); the
scope-matrix test walks the app's own route table against it, so a route missing here fails that
test the day it is added. :func:`may_see` is the rule every listing applies (``visible_models``,
``/api/models``) and :class:`ModelScope` applies it to one request's answer: it filters what names
a model the key may not see, and :meth:`ModelScope.redact` takes such names out of free text (an
event's message, an error's hint).

An admin key and a service without keys see everything; anonymous callers of public routes (the
page's files, ``/health``, ``/ready``, a ``metrics_public`` ``/metrics``) see what they always saw.
"""

from __future__ import annotations

import contextvars
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property
from typing import TYPE_CHECKING, Any

from ._names import served_names
from ._recording import request_key
from ._routes import MODEL_ROUTES

if TYPE_CHECKING:
    from ...access import Key
    from ...supervisor import Supervisor

__all__ = [
    "ROUTES",
    "ModelScope",
    "Visibility",
    "may_see",
    "model_scope",
    "redacted",
    "request_scope",
    "visibility_of",
]


class Visibility(StrEnum):
    """What a key that is not an admin, scoped to some models, gets from a route."""

    PUBLIC = "public"
    """No key needed, and the answer names no model (probes, the status page's files)."""
    ADMIN = "admin"
    """An admin key only: any other key gets the 403 ``admin_required``."""
    ANY_KEY = "any key"
    """Any key; the answer describes the service, not its models (the API document, versions)."""
    SCOPED = "scoped"
    """Any key; the answer lists or describes models, cut to those the key may see (listings,
    events, devices, metrics, throughput, activity)."""
    OWN = "own"
    """Any key; only the records the key made itself (files, batches, usage, an activity row):
    another key's record is answered as if it did not exist, or refused."""
    MODEL = "model"
    """About the one model the request names (in its body, form, query or path): a model outside
    the key's scope is the model routes' 403 ``model_not_allowed``."""


_V = Visibility

#: Every route of the app, by (method, Starlette path), with its class. ``HEAD`` follows ``GET``;
#: the status page's static files are the ``/ui`` mount. The scope-matrix test fails for a served
#: route missing here, and for an entry the app does not serve.
ROUTES: Mapping[tuple[str, str], Visibility] = {
    # Probes and the status page (its files hold no data: it reads the control API with a key).
    ("GET", "/health"): _V.PUBLIC,
    ("GET", "/ready"): _V.PUBLIC,
    ("GET", "/"): _V.PUBLIC,
    ("GET", "/ui"): _V.PUBLIC,
    # A key's series only, of the model-labelled families (metrics_public: anonymous sees all).
    ("GET", "/metrics"): _V.SCOPED,
    # The OpenAI-compatible listing and every model route, in every dialect (Ollama's too).
    ("GET", "/v1/models"): _V.SCOPED,
    ("GET", "/v1/models/{model_id:path}"): _V.MODEL,
    **{(r.method, r.path): _V.MODEL for r in MODEL_ROUTES},
    # The control API.
    ("GET", "/api/models"): _V.SCOPED,
    ("POST", "/api/models"): _V.ADMIN,
    ("POST", "/api/models/{name}/load"): _V.ADMIN,
    ("POST", "/api/models/{name}/unload"): _V.ADMIN,
    ("GET", "/api/models/{name}/logs"): _V.MODEL,
    ("POST", "/api/reload"): _V.ADMIN,
    ("GET", "/api/events"): _V.SCOPED,
    ("GET", "/api/plan"): _V.SCOPED,
    ("GET", "/api/devices"): _V.SCOPED,
    ("GET", "/api/throughput"): _V.SCOPED,
    ("GET", "/api/activity"): _V.SCOPED,
    ("GET", "/api/activity/{ident:int}"): _V.OWN,
    ("GET", "/api/usage"): _V.OWN,
    ("GET", "/api/openapi.json"): _V.ANY_KEY,
    ("GET", "/api/docs"): _V.ANY_KEY,
    # The Ollama API.
    ("GET", "/api/version"): _V.ANY_KEY,
    ("GET", "/api/tags"): _V.SCOPED,
    ("GET", "/api/ps"): _V.SCOPED,
    ("POST", "/api/show"): _V.MODEL,
    ("POST", "/api/pull"): _V.ADMIN,
    **{
        (method, path): _V.ADMIN
        for path in ("/api/create", "/api/copy", "/api/push", "/api/delete")
        for method in ("POST", "DELETE")
    },
    # OpenAI's Files and Batches API: a key's own records.
    ("POST", "/v1/files"): _V.OWN,
    ("GET", "/v1/files"): _V.OWN,
    ("GET", "/v1/files/{file_id}"): _V.OWN,
    ("DELETE", "/v1/files/{file_id}"): _V.OWN,
    ("GET", "/v1/files/{file_id}/content"): _V.OWN,
    ("POST", "/v1/batches"): _V.OWN,
    ("GET", "/v1/batches"): _V.OWN,
    ("GET", "/v1/batches/{batch_id}"): _V.OWN,
    ("POST", "/v1/batches/{batch_id}/cancel"): _V.OWN,
}


def visibility_of(method: str, path: str) -> Visibility | None:
    """The class of the route served at ``path`` (Starlette's pattern) for ``method``; None for a
    route that has none (a bug the scope-matrix test reports)."""
    return ROUTES.get(("GET" if method == "HEAD" else method, path))


def may_see(key: Key | None, names: Iterable[str], *, control: bool = False) -> bool:
    """The rule: whether ``key`` may see the model served under ``names`` (its name, and its
    variants' and adapters' ``X:Y``): it may use one of them. A service without keys sees all;
    with ``control`` (the control API and everything that observes the service) an admin key
    sees all too, since it may load, unload and reconfigure any model. Without ``control`` (the
    model listings a client picks from: ``/v1/models``, Ollama's ``/api/tags``) an admin key is
    shown the models its ``models`` allow, like any other key."""
    return key is None or (control and key.admin) or any(key.may_use(n) for n in names)


#: What a name the caller may not see becomes in free text.
_ELSEWHERE = "another model"
_MARK = "\x00"  # a hidden name's place while list items are taken out (no text holds a NUL)


@dataclass
class ModelScope:
    """One request's view of the configured models, by :func:`may_see` (``control``): what the
    observing routes filter their answers with, and what the error renderer redacts with."""

    key: Key | None
    supervisor: Supervisor
    _cache: dict[str, bool] = field(default_factory=dict, init=False, repr=False)

    @property
    def everything(self) -> bool:
        """The caller sees every model (an admin key, or a service without keys): no filtering."""
        return self.key is None or self.key.admin

    @cached_property
    def _served(self) -> dict[str, tuple[str, ...]]:
        """Configured model → every name it is served under (itself first), read once."""
        sup = self.supervisor
        return {n: (n, *served_names(n, sup.config_of(n))) for n in sup.names()}

    def sees(self, name: str) -> bool:
        """Whether the caller may see ``name``: a configured model (it may use the model or one
        of its variants or adapters, as ``/api/models`` shows it), or a served name ``X:Y``."""
        if self.everything:
            return True
        found = self._cache.get(name)
        if found is None:
            found = self._cache[name] = may_see(self.key, self._served.get(name, (name,)), control=True)
        return found

    def check(self, name: str) -> None:
        """The 403 a request to model ``name`` gets (:meth:`Key.check_model`'s: the same shape
        and code on every route) when the caller may not see it."""
        if self.key is not None and not self.sees(name):
            self.key.check_model(name)

    def hidden(self, value: object) -> bool:
        """``value`` is exactly the name of a model the caller may not see."""
        return isinstance(value, str) and value in self._names and not self.sees(value)

    @cached_property
    def _names(self) -> frozenset[str]:
        return frozenset(n for names in self._served.values() for n in names)

    @cached_property
    def _pattern(self) -> re.Pattern[str] | None:
        """Every served name as a whole word, longest first (``qwen2.5`` is not ``qwen2`` and
        ``.5``); None when the caller may see every one of them."""
        if self.everything or all(self.sees(n) for n in self._names):
            return None
        alternatives = "|".join(re.escape(n) for n in sorted(self._names, key=len, reverse=True))
        return re.compile(rf"(?<![\w-])(?:{alternatives})(?![\w-])")

    def redact(self, text: str) -> str:
        """``text`` without the names of the models the caller may not see: an item of a comma
        list (``known models: a, b``) is left out, any other mention says "another model"."""
        pattern = self._pattern
        if pattern is None or not text:
            return text
        marked = pattern.sub(lambda m: m[0] if self.sees(m[0]) else _MARK, text)
        if _MARK not in marked:
            return text
        marked = marked.replace(f", {_MARK}", "").replace(f"{_MARK}, ", "")
        return marked.replace(_MARK, _ELSEWHERE)

    def filtered(self, value: Any) -> Any:
        """A JSON value as the caller may see it: a list item or object key that is a hidden
        model's name is left out, and every text is :meth:`redact`-ed."""
        if self.everything or self._pattern is None:  # nothing to hide
            return value
        if isinstance(value, str):
            return self.redact(value)
        if isinstance(value, list):
            return [self.filtered(v) for v in value if not self.hidden(v)]
        if isinstance(value, dict):
            return {k: self.filtered(v) for k, v in value.items() if not self.hidden(k)}
        return value


def model_scope(scope: Any, supervisor: Supervisor) -> ModelScope:
    """The request's :class:`ModelScope` (its key from the ASGI ``scope``)."""
    return ModelScope(request_key(scope), supervisor)


#: The request's :class:`ModelScope`, set by the middleware once it knows the key: the error
#: renderer reads it (an error is rendered far from the request, and takes no scope).
request_scope: contextvars.ContextVar[ModelScope | None] = contextvars.ContextVar(
    "request_scope", default=None
)


def redacted(text: str) -> str:
    """``text`` as the request being handled may see it (unchanged outside a request)."""
    scope = request_scope.get()
    return text if scope is None else scope.redact(text)
