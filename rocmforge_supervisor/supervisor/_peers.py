"""The ``[peers.*]`` servers: their models as served names, one admission queue per peer, and a
circuit breaker, so that a request for a peer's model is a request like any other to the gateway.

A peer model has no process here. The supervisor hands out an :class:`~..client.Upstream` for it
(the peer's URL, its key in the header its API wants, its own model id for the body, its
timeouts) through the same ``acquire`` as a local model's child, in the peer's admission queue
(``max_concurrency``, priority classes, fair between keys). What it serves is read from its
``/v1/models`` (``models = ["*"]``) in the background, every ``refresh`` seconds, so a peer that is
down never slows a listing: the listing reads what the last refresh found.

**Names.** A peer model is served as ``PEER/ID`` always, and as ``[prefix]ID`` unless a local model
has that name (local names win) or two peers give it (then it is ambiguous: refused with the
qualified names listed).

**Breaker.** A peer that refuses the connection, times out, or answers 5xx is cooled down for
``cooldown`` seconds: requests to it are refused at once (a fallback skips it) until then, and an
event says so; the first request after the cooldown tries it again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable, Collection, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx

from .._errors import InvalidRequest, ModelNotFound, ServerUnavailable
from ..access import PriorityClass
from ..client import Upstream
from ..config import ModelConfig, PeerConfig
from .admission._admission import Admission
from .backends._backends import backend_of
from .model._status import ROUTE_WORDS, ModelState, ModelStatus

__all__ = ["MESSAGES_ROUTES", "OPENAI_ROUTES", "Peer", "PeerModel", "PeerSet"]

log = logging.getLogger("rocmforge.peers")

#: What an OpenAI-compatible peer is sent (Anthropic's Messages are translated to its chat).
OPENAI_ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
#: What an Anthropic-compatible peer is sent.
MESSAGES_ROUTES = ("/v1/messages", "/v1/messages/count_tokens")

#: The longest a peer's ``/v1/models`` may take before a refresh gives up on it.
_LIST_TIMEOUT = 10.0
#: A peer's listing is read at most this many bytes (a hostile peer cannot fill the memory).
_LIST_MAX_BYTES = 4 << 20


@dataclass(frozen=True)
class PeerModel:
    """One model of one peer, under the name the gateway serves it as."""

    peer: str
    model_id: str
    served: str
    config: ModelConfig


@dataclass
class Peer:
    """One ``[peers.NAME]`` now: what its last listing said, its breaker, its queue."""

    name: str
    config: PeerConfig
    admission: Admission = field(init=False)
    #: The model ids it serves: its ``models`` list, or what its ``/v1/models`` listed last.
    model_ids: list[str] = field(default_factory=list)
    #: A forge peer's states of its models (id → state), from its listing.
    states: dict[str, str] = field(default_factory=dict)
    #: Why its last refresh or request failed (None once one succeeded).
    last_error: str | None = None
    cooled_until: float = 0.0
    since: float = field(default_factory=time.time)
    in_flight: int = 0
    waiting: int = 0
    requests_total: int = 0
    failures: int = 0

    def __post_init__(self) -> None:
        self.admission = Admission(self.config.max_concurrency)
        if not self.config.discovers:
            self.model_ids = list(self.config.models)

    @property
    def cooling(self) -> bool:
        return time.monotonic() < self.cooled_until

    def upstream(self, model_id: str) -> Upstream:
        key = self.config.api_key()
        if self.config.api_key_env is not None and not key:
            raise ServerUnavailable(
                f"peer {self.name!r} needs its key in ${self.config.api_key_env}, which is not set "
                "in forge serve's environment",
                hint=f"set {self.config.api_key_env} for the service (systemctl edit, or the shell) and restart it",
            )
        t = self.config.timeouts
        return Upstream(
            self.config.url,
            key,
            key_header="x-api-key" if self.config.api == "anthropic" else "authorization",
            model=model_id,
            peer=self.name,
            timeouts=(t.connect, t.first_byte, t.idle),
            set_fields=self.config.set,
            strip_fields=tuple(self.config.strip),
        )

    def routes(self) -> tuple[str, ...]:
        if self.config.api == "anthropic":
            return MESSAGES_ROUTES
        if self.config.api == "forge":
            return OPENAI_ROUTES + MESSAGES_ROUTES
        return OPENAI_ROUTES


class PeerSet:
    """Every configured peer and the names their models are served as."""

    def __init__(
        self,
        peers: Mapping[str, PeerConfig],
        local: Callable[[], Collection[str]],
        *,
        on_change: Callable[[str, str, dict[str, Any]], None] | None = None,
    ) -> None:
        self.peers = {name: Peer(name, config) for name, config in peers.items()}
        self._local = local
        self._on_change = on_change
        self._names: dict[str, PeerModel] = {}
        self._ambiguous: dict[str, list[str]] = {}
        self._configs: dict[tuple[str, str], ModelConfig] = {}
        self._rebuild()

    # -- names -------------------------------------------------------------------------------------

    def _config_of(self, peer: Peer, model_id: str) -> ModelConfig:
        """A peer model's configuration as the gateway's checks read it: its routes, no path."""
        key = (peer.name, model_id)
        cached = self._configs.get(key)
        if cached is None or cached.routes != list(peer.routes()):
            cached = ModelConfig.model_construct(
                backend="peer", path=f"{peer.config.url}#{model_id}", routes=list(peer.routes())
            )
            self._configs[key] = cached
        return cached

    def _rebuild(self) -> None:
        """The served names, after a listing or a change of the local models."""
        local = self._local()
        names: dict[str, PeerModel] = {}
        short: dict[str, list[PeerModel]] = {}
        for peer in self.peers.values():
            for model_id in peer.model_ids:
                pm = PeerModel(
                    peer.name, model_id, f"{peer.name}/{model_id}", self._config_of(peer, model_id)
                )
                names[pm.served] = pm
                short.setdefault(f"{peer.config.prefix}{model_id}", []).append(pm)
        ambiguous: dict[str, list[str]] = {}
        for name, pms in short.items():
            if name in local or name in names:
                continue  # a local model (or a qualified name) wins
            if len(pms) == 1:
                names[name] = PeerModel(pms[0].peer, pms[0].model_id, name, pms[0].config)
            else:
                ambiguous[name] = sorted(pm.served for pm in pms)
        self._names = names
        self._ambiguous = ambiguous
        #: The served names of every peer model (qualified ones included), none a local model's:
        #: an attribute, so a request's name lookup calls nothing here.
        self.served = list(names)

    def changed_locals(self) -> None:
        """The local models changed (a reload): a name a local model took is no longer a peer's."""
        self._rebuild()

    def shown(self) -> list[PeerModel]:
        """One entry per peer model for the listings: its short name when it has one, else
        ``PEER/ID`` (the qualified name is served too, not listed twice)."""
        by_target: dict[tuple[str, str], PeerModel] = {}
        for pm in self._names.values():
            key = (pm.peer, pm.model_id)
            if key not in by_target or "/" in by_target[key].served:
                by_target[key] = pm
        return list(by_target.values())

    def find(self, name: str) -> PeerModel | None:
        """The peer model served as ``name``; None when no peer serves it. An ambiguous name is a
        400 listing the qualified names."""
        pm = self._names.get(name)
        if pm is not None:
            return pm
        choices = self._ambiguous.get(name)
        if choices:
            raise InvalidRequest(
                f"model {name!r} is served by more than one peer: {', '.join(choices)}",
                param="model",
                hint="name one of them as PEER/MODEL",
            )
        return None

    def get(self, name: str) -> PeerModel:
        pm = self.find(name)
        if pm is None:
            raise ModelNotFound(f"model {name!r} is not configured", hint="see GET /v1/models")
        return pm

    # -- requests ----------------------------------------------------------------------------------

    @asynccontextmanager
    async def acquire(
        self, name: str, *, priority: PriorityClass = "interactive", key: str | None = None
    ) -> AsyncIterator[Upstream]:
        """A place in the peer's queue and where to send, for one request."""
        pm = self.get(name)
        peer = self.peers[pm.peer]
        if peer.cooling:
            left = peer.cooled_until - time.monotonic()
            raise ServerUnavailable(
                f"peer {peer.name!r} is cooling down for {left:.0f} s after it failed: {peer.last_error}",
                hint="retry later, or name a local model (or set fallback on it)",
            )
        upstream = peer.upstream(pm.model_id)
        peer.waiting += 1
        try:
            await peer.admission.take(priority, key)
        finally:
            peer.waiting -= 1
        peer.in_flight += 1
        peer.requests_total += 1
        try:
            yield upstream
        finally:
            peer.in_flight -= 1
            peer.admission.give(priority, key)

    def failed(self, peer_name: str, reason: str) -> None:
        """A request to the peer failed as a peer fails (refused, timed out, a 5xx): cool it down."""
        peer = self.peers.get(peer_name)
        if peer is None:
            return
        peer.failures += 1
        peer.last_error = reason
        was = peer.cooling
        peer.cooled_until = time.monotonic() + peer.config.cooldown
        if not was and self._on_change is not None:
            self._on_change(peer_name, "cooling", {"reason": reason, "seconds": peer.config.cooldown})
        log.warning("peer %s failed (%s): cooled down for %g s", peer_name, reason, peer.config.cooldown)

    def answered(self, peer_name: str) -> None:
        peer = self.peers.get(peer_name)
        if peer is not None and peer.last_error is not None and not peer.cooling:
            peer.last_error = None
            if self._on_change is not None:
                self._on_change(peer_name, "ready", {})

    # -- listings ----------------------------------------------------------------------------------

    async def refresh(self, client: httpx.AsyncClient) -> None:
        """Read every peer's ``/v1/models`` at once (each bounded): the discovered ids, a forge
        peer's states, and whether it answers."""
        async with anyio.create_task_group() as tg:
            for peer in self.peers.values():
                tg.start_soon(self._refresh_one, client, peer)
        self._rebuild()

    async def _refresh_one(self, client: httpx.AsyncClient, peer: Peer) -> None:
        try:
            upstream = peer.upstream("")
            with anyio.fail_after(_LIST_TIMEOUT):
                r = await client.get(upstream.url("/v1/models"), headers=upstream.headers())
            if r.status_code != 200:
                raise ValueError(f"GET /v1/models answered {r.status_code}")
            if len(r.content) > _LIST_MAX_BYTES:
                raise ValueError("its /v1/models answer is too large")
            listed = _listed(r.json())
        except (ServerUnavailable, httpx.HTTPError, TimeoutError, ValueError) as exc:
            reason = str(exc) or type(exc).__name__
            if peer.last_error != reason:
                log.warning("peer %s: its models could not be listed: %s", peer.name, reason)
            peer.last_error = f"listing its models: {reason}"
            return
        if peer.config.discovers:
            peer.model_ids = [i for i, _ in listed]
        peer.states = {i: s for i, s in listed if s}
        if peer.last_error is not None and not peer.cooling:
            peer.last_error = None

    async def run(self, client: httpx.AsyncClient) -> None:
        """Refresh every peer now and then every ``refresh`` seconds (the shortest of them)."""
        if not self.peers:
            return
        every = min(p.config.refresh for p in self.peers.values())
        while True:
            await self.refresh(client)
            await anyio.sleep(every)

    def status(self, pm: PeerModel) -> ModelStatus:
        """What ``GET /api/models`` and ``forge ps`` show of a peer model."""
        peer = self.peers[pm.peer]
        state = ModelState.FAILED if peer.cooling else ModelState.READY
        remote = peer.states.get(pm.model_id)
        return ModelStatus(
            name=pm.served,
            state=state,
            since=peer.since,
            path=f"peer {peer.name}: {peer.config.url} · {pm.model_id}",
            last_error=peer.last_error,
            in_flight=peer.in_flight,
            waiting=peer.waiting,
            max_concurrency=peer.config.max_concurrency,
            requests_total=peer.requests_total,
            backend="peer",
            label=backend_of(pm.config).label,
            failure_kind=f"its server says: {remote}" if remote and remote != "ready" else None,
            serves=_serves(pm.config),
            peer=peer.name,
            url=peer.config.url,
        )


def _serves(config: ModelConfig) -> list[str]:
    """What a peer model answers, in :data:`ROUTE_WORDS`: its routes; chat too where its API is
    Anthropic's Messages (an OpenAI chat is translated to it)."""
    backend = backend_of(config)
    words = [w for w, path in ROUTE_WORDS.items() if backend.serves(config, path)]
    if "/v1/messages" in config.command_routes and "chat" not in words:
        words.insert(0, "chat")
    return words


def _listed(body: Any) -> list[tuple[str, str | None]]:
    """(id, state) of each model a ``/v1/models`` answer lists: OpenAI's and Anthropic's shape
    (``data``), Ollama's (``models``); a forge peer adds each model's ``state``."""
    items = body.get("data") if isinstance(body, dict) else None
    if items is None and isinstance(body, dict):
        items = body.get("models")
    if not isinstance(items, list):
        raise ValueError("its /v1/models answer has no model list")
    out: list[tuple[str, str | None]] = []
    for item in items:
        if isinstance(item, dict):
            ident = item.get("id") or item.get("name") or item.get("model")
            if isinstance(ident, str) and ident and len(ident) <= 256:
                state = item.get("state")
                out.append((ident, state if isinstance(state, str) else None))
    return out
