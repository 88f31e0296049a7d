"""What the gateway knows about each model, for every API that lists or describes one.

``/v1/models`` and Ollama's ``/api/tags``, ``/api/show``, ``/api/ps`` answer from the same facts,
so they never disagree: the GGUF card and capabilities (:mod:`._model_card`), the context a
request can use, what the model takes besides text, its llama-server arguments. The same facts
decide the checks every model route makes before forwarding (tools, media).

The running child's own ``/props`` is read straight from its address (the supervisor's
:class:`~..supervisor.ModelView`), with a short timeout, once per child process: a listing must
not take one of the model's request slots (a model busy with ``parallel`` streams would make
``/v1/models`` wait for one of them to end), nor wait long for a child that does not answer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx

from ..._errors import ForgeError
from ...config import get_settings
from ...models import ProjectorInfo, resolve_projector_path
from ...supervisor import Supervisor, backend_of
from ..core._names import served_names
from ..core._recording import request_key
from ..core._visibility import may_see
from ._media import refuse_unusable_media
from ._model_card import ModelCard, capabilities, card_for, projector_for
from ._rerank import reranks
from ._tools import refuse_unusable_tools

__all__ = ["PROPS_TIMEOUT", "ModelFacts", "check_media", "check_tools", "model_list", "visible_models"]

#: Seconds a listing waits for a child's ``/props`` (it answers in milliseconds when healthy).
PROPS_TIMEOUT = 2.0


@dataclass
class ModelFacts:
    """The facts of the supervisor's models (one per app): cards, served context, modalities."""

    supervisor: Supervisor
    client: httpx.AsyncClient
    """The gateway's connection pool to its children."""
    resolve_path: Callable[[str], Path | None]
    """A model's GGUF path, without downloading (blocking)."""
    props_timeout: float = PROPS_TIMEOUT
    _props: dict[str, tuple[int, dict[str, Any]]] = field(default_factory=dict, init=False, repr=False)
    """model → (child pid, its ``/props``): one entry per model, replaced with its next child."""

    async def card(self, name: str) -> ModelCard | None:
        """The model's GGUF card; None when its file is not local yet (a hub model not fetched)."""
        v = self.supervisor.view(name)
        if backend_of(v.config).remote:  # a peer's model: no file here
            return None

        def read() -> ModelCard | None:
            p = v.model_path or self.resolve_path(v.config.path)
            if p is None:
                return None
            try:
                return card_for(p)
            except (ForgeError, OSError):
                return None

        return await anyio.to_thread.run_sync(read)

    async def props(self, name: str) -> dict[str, Any] | None:
        """The running child's ``/props`` (read once per child process); None when it is not
        ready or does not answer within :attr:`props_timeout`."""
        v = self.supervisor.view(name)
        child = v.child
        if not v.ready or child is None or child.pid is None:
            return None
        cached = self._props.get(name)
        if cached is not None and cached[0] == child.pid:
            return cached[1]
        try:
            r = await self.client.get(
                f"{child.base_url}/props", headers=child.headers(), timeout=self.props_timeout
            )
            props = r.json() if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return None
        if not isinstance(props, dict):
            return None
        self._props[name] = (child.pid, props)
        return props

    async def served_ctx(self, name: str) -> int | None:
        """Tokens one request can use: the running child's per-slot n_ctx, else the config's."""
        props = await self.props(name)
        if props is not None:
            try:
                return int(props["default_generation_settings"]["n_ctx"])
            except (KeyError, TypeError, ValueError):
                return None
        v = self.supervisor.view(name)
        if v.ready:
            return None
        return v.ctx_per_request

    async def projector(self, name: str) -> ProjectorInfo | None:
        """The model's projector: as its child was started, else its configured ``mmproj`` when
        that is a local file (or ``auto`` beside a local model); None for one not fetched yet."""
        v = self.supervisor.view(name)
        if v.projector is not None:
            return v.projector
        mmproj = v.config.mmproj
        model_ref = v.config.path
        if not mmproj or mmproj.startswith("hf:") or (mmproj == "auto" and model_ref.startswith("hf:")):
            return None  # a listing must never start a download

        def read() -> ProjectorInfo | None:
            model_path = v.model_path if v.started else self.resolve_path(model_ref)
            if model_path is None:
                return None
            try:
                return projector_for(resolve_projector_path(mmproj, model_ref, model_path, get_settings()))
            except (ForgeError, OSError):
                return None

        return await anyio.to_thread.run_sync(read)

    async def modalities(self, name: str) -> tuple[str, ...]:
        """What the model takes besides text: the running child's ``/props.modalities``, else what
        its projector file says."""
        props = await self.props(name)
        if props is not None and isinstance(props.get("modalities"), dict):
            return tuple(k for k in ("vision", "audio") if props["modalities"].get(k))
        projector = await self.projector(name)
        return projector.modalities if projector is not None else ()

    def args(self, name: str) -> list[str]:
        """The child's extra llama-server arguments (as started, else as configured)."""
        return list(self.supervisor.view(name).args)

    async def tools(self, name: str) -> bool | None:
        """Whether the model takes tools: its ``tools`` key when set, else the running child's
        chat template (``/props``' ``chat_template_caps.supports_tools``: the template llama-server
        really renders, a ``--chat-template`` of the user's included); None: not running, the
        GGUF's template decides."""
        config = self.supervisor.view(name).config
        if config.tools is not None:
            return config.tools
        props = await self.props(name)
        caps = props.get("chat_template_caps") if props is not None else None
        if isinstance(caps, dict) and isinstance(caps.get("supports_tools"), bool):
            return bool(caps["supports_tools"])
        return None

    async def capabilities(self, name: str, card: ModelCard) -> list[str]:
        """The model's capabilities as every listing reports them."""
        rerank = reranks(self.supervisor.view(name).config)
        tools = await self.tools(name)
        return capabilities(card, self.args(name), await self.modalities(name), tools=tools, rerank=rerank)


async def check_tools(facts: ModelFacts, name: str, body: dict[str, Any]) -> None:
    """A 400 when ``body`` sends tools that model ``name`` cannot use (:mod:`._tools`): every
    route's way to that one check, with the model's card and arguments as ``/v1/models`` reads them."""
    config = facts.supervisor.view(name).config
    card, args, tools = await facts.card(name), facts.args(name), await facts.tools(name)
    configured = config.tools is not None
    refuse_unusable_tools(name, body, card, args, tools=tools, rerank=reranks(config), configured=configured)


def check_media(supervisor: Supervisor, name: str, body: dict[str, Any], *, allow_remote: bool) -> None:
    """A 400 when ``body``'s images/audio cannot go to model ``name`` (:mod:`._media`): the one
    check every API's requests meet, with whether the model has a projector (``mmproj``). A
    command's server decides for itself what it takes (forge cannot know): only the URLs are
    checked (``file://``, remote ones, malformed base64)."""
    config = supervisor.config_of(name)
    has_projector = bool(config.mmproj) or backend_of(config).judges_media
    refuse_unusable_media(name, body, has_projector=has_projector, allow_remote=allow_remote)


def visible_models(scope: Any, names: Iterable[str], *, control: bool = False) -> list[str]:
    """The models a request's key may use, of ``names``: what every listing shows it (``/v1/models``,
    Ollama's ``/api/tags`` and ``/api/ps``). A key scoped to one model was offered every model, and
    each choice but one was then a 403. The rule is :func:`~..core._visibility.may_see`'s, one name
    at a time (the control API and every observing route apply it per model: ``ModelScope``)."""
    key = request_key(scope)
    return [n for n in names if may_see(key, (n,), control=control)]


async def model_list(facts: ModelFacts, created: float, scope: Any = None) -> list[dict[str, Any]]:
    """``/v1/models``' entries: OpenAI's keys plus ``context_length``, ``capabilities``, ``state``;
    only the request's key's models (:func:`visible_models`) where ``scope`` is given."""
    data = []
    views = facts.supervisor.views()
    also = {v.name: served_names(v.name, v.config) for v in views}
    shown = set(visible_models(scope or {}, [n for v in views for n in (v.name, *also[v.name])]))
    for v in views:
        name = v.name
        if name not in shown and not shown.intersection(also[name]):
            continue
        card = await facts.card(name)
        entry: dict[str, Any] = {
            "id": name,
            "object": "model",
            "created": int(created),
            "owned_by": "rocmforge",
            "state": v.state.value,
            "backend": v.config.backend,
        }
        if v.status.peer is not None:
            entry["peer"] = v.status.peer
        ctx = await facts.served_ctx(name)
        if card is not None:
            entry["context_length"] = ctx or card.trained_ctx
            entry["capabilities"] = await facts.capabilities(name, card)
        elif ctx:
            entry["context_length"] = ctx
        if name in shown:
            data.append(entry)
        # Its variants and adapters: the same child, so the same facts, with their parent named.
        data += [{**entry, "id": n, "parent": name} for n in also[name] if n in shown]
    return data
