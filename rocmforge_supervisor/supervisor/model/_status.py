"""A supervised model's states, the moves allowed between them, its crash breaker, its status
(and, for placement, the memory it holds: :func:`loaded_model`).

States::

    unloaded → loading → ready → draining → stopped
                  ↑  ↺     │                   │
                  └────────┘  crash / hang: restart after backoff (loading again)
    loading/ready/draining → failed   the breaker opened (or the input can never start); reason kept
    failed → unloaded                 reset (``forge load NAME``, a reload)
    stopped → loading                 started again by the next request

:data:`TRANSITIONS` is the table :class:`~._managed.ManagedModel` checks every move against, as
llama-swap's ``isValidTransition`` does: a move not in it is a bug, raised, not a state.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Protocol, Self

from ..._argv import EMBEDDING_ARCHITECTURES, normalise_flag
from ...process import Breaker  # the one restart policy's breaker, shared with `forge worker`
from ..backends._backends import backend_of
from ..placement._placement_types import LoadedModel, WorkerShare

if TYPE_CHECKING:
    import anyio

    from ..._errors import ResidencyConflict
    from ...config import ModelConfig, SupervisorConfig
    from ...process import ModelServer, RestartPolicy
    from .._events import EventBus
    from ..admission._admission import Admission
    from ..contexts._keep_context import ContextKeeper
    from ..launch._launch import LaunchPlan
    from ..placement._residency import Residency

__all__ = [
    "ROUTE_WORDS",
    "TRANSITIONS",
    "Breaker",
    "IllegalTransition",
    "ModelState",
    "ModelStatus",
    "SupervisedModel",
    "check_transition",
    "loaded_model",
    "model_status",
]


class ModelState(StrEnum):
    UNLOADED = "unloaded"
    LOADING = "loading"
    READY = "ready"
    DRAINING = "draining"
    STOPPED = "stopped"
    FAILED = "failed"


_S = ModelState
TRANSITIONS: Mapping[ModelState, frozenset[ModelState]] = {
    _S.UNLOADED: frozenset({_S.LOADING}),
    # loading → loading: a restart's backoff (no child now) and the next attempt.
    _S.LOADING: frozenset({_S.LOADING, _S.READY, _S.FAILED, _S.STOPPED}),
    _S.READY: frozenset({_S.LOADING, _S.DRAINING, _S.FAILED, _S.STOPPED}),
    _S.DRAINING: frozenset({_S.STOPPED, _S.FAILED}),
    _S.STOPPED: frozenset({_S.LOADING}),
    _S.FAILED: frozenset({_S.UNLOADED}),
}


#: The kinds of request a model's status names (``serves``), each with the gateway route that
#: answers it: what the status page offers a model for (its chat box takes the ``chat`` ones).
ROUTE_WORDS: Mapping[str, str] = {
    "chat": "/v1/chat/completions",
    "completion": "/v1/completions",
    "embeddings": "/v1/embeddings",
    "transcription": "/v1/audio/transcriptions",
    "rerank": "/v1/rerank",
}


class IllegalTransition(RuntimeError):
    """A state change the table does not allow: a bug in the state machine."""


def check_transition(old: ModelState, new: ModelState) -> None:
    if new not in TRANSITIONS[old]:
        raise IllegalTransition(f"{old.value} → {new.value} is not an allowed transition")


@dataclass(frozen=True)
class ModelStatus:
    """One model as the control API reports it (``GET /api/models``); :meth:`to_json` is the wire."""

    name: str
    state: ModelState
    since: float
    path: str
    pid: int | None = None
    port: int | None = None
    devices: list[str] = field(default_factory=list)
    restarts: int = 0
    stalls: int = 0
    pressure_evictions: int = 0
    sleeping: bool = False
    """The child freed its model after ``sleep_idle`` idle seconds; the next request reloads it."""
    last_error: str | None = None
    """Why the model is failed or restarting now; None once it is ready again."""
    last_crash: str | None = None
    """Why its previous child ended, kept after a recovery (``last_error`` is not)."""
    uptime: float | None = None
    in_flight: int = 0
    waiting: int = 0
    load_seconds: float | None = None
    estimated_bytes: dict[str, int] = field(default_factory=dict)
    actual_bytes: dict[str, int] = field(default_factory=dict)
    context_bytes: dict[str, int] = field(default_factory=dict)
    """GPU key → the device context counted for its child: in ``estimated_bytes``, and held on top
    of ``actual_bytes`` (the child's logged allocations, which never include it)."""
    log_path: str | None = None
    modalities: list[str] = field(default_factory=list)
    """What the model takes besides text (``vision``, ``audio``): its projector's, once loaded."""
    # For the status page: why it failed, what the child said last, when TTL unloads it.
    failure_kind: str | None = None
    last_stderr: list[str] = field(default_factory=list)
    log_last: list[str] = field(default_factory=list)
    ttl: float | None = None
    ttl_left: float | None = None
    max_concurrency: int = 0
    queue_limit: int = 0
    requests_total: int = 0
    workers: list[WorkerShare] = field(default_factory=list)
    """The RPC workers holding its layers (``[[workers]]``), with their shares; else empty."""
    keep_context: bool = False
    contexts: dict[str, Any] = field(default_factory=dict)
    """Its saved KV-cache slots (count, tokens, bytes, newest) and this run's save/restore totals."""
    backend: str = "llama"
    """The server that runs it: ``llama`` (llama-server), ``whisper`` (whisper-server) or ``command``."""
    label: str = ""
    """Its kind as the status page names it (its backend's ``label``: "whisper · speech to text")."""
    serves: list[str] = field(default_factory=list)
    """The kinds of request it answers, words of :data:`ROUTE_WORDS` (``chat``, ``completion``,
    ``embeddings``, ``transcription``, ``rerank``); its variants and adapters answer the same."""
    residency: dict[str, Any] = field(default_factory=dict)
    """Its residency rules: ``pinned``, ``swap``, ``evict_cost``, ``group``, ``default``."""
    context: dict[str, Any] = field(default_factory=dict)
    """Its context as started (else as configured): ``ctx_size``, ``parallel``, ``kv_unified`` and
    ``per_request``, the tokens one request can use (``/v1/models``' ``context_length``)."""
    queue: dict[str, Any] = field(default_factory=dict)
    """Its admission queue: ``waiting`` and ``in_flight`` per class, ``waiting_by_key`` per key
    name (``-``: no key), and ``interactive_slots``."""
    variants: list[str] = field(default_factory=list)
    """The names its ``[variants.*]`` are served under (``X:json``): the same child."""
    adapters: list[str] = field(default_factory=list)
    """The names its LoRA ``[adapters.*]`` are served under (``X:tuned``): the same child."""
    peer: str | None = None
    """The ``[peers.*]`` entry that serves it (no child here); None for a local model."""
    url: str | None = None
    """Its peer's base URL."""

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "backend": self.backend,
            "label": self.label,
            "serves": list(self.serves),
            "state": self.state.value,
            "since": self.since,
            "pid": self.pid,
            "port": self.port,
            "devices": list(self.devices),
            "workers": [w.to_json() for w in self.workers],
            "restarts": self.restarts,
            "stalls": self.stalls,
            "pressure_evictions": self.pressure_evictions,
            "sleeping": self.sleeping,
            "last_error": self.last_error,
            "last_crash": self.last_crash,
            "uptime": self.uptime,
            "in_flight": self.in_flight,
            "waiting": self.waiting,
            "load_seconds": self.load_seconds,
            "path": self.path,
            "memory": {
                "estimated_bytes": dict(self.estimated_bytes),
                "actual_bytes": dict(self.actual_bytes),
                # Only for a child on a GPU: a CPU child's status keeps the keys it always had.
                **({"context_bytes": dict(self.context_bytes)} if self.context_bytes else {}),
            },
            "log_path": self.log_path,
            "modalities": list(self.modalities),
            "failure_kind": self.failure_kind,
            "last_stderr": list(self.last_stderr),
            "log_last": list(self.log_last),
            "ttl": self.ttl,
            "ttl_left": self.ttl_left,
            "max_concurrency": self.max_concurrency,
            "queue_limit": self.queue_limit,
            "requests_total": self.requests_total,
            "keep_context": self.keep_context,
            "contexts": dict(self.contexts),
            "context": dict(self.context),
            "residency": dict(self.residency),
            "queue": dict(self.queue),
            "variants": list(self.variants),
            "adapters": list(self.adapters),
            **({"peer": self.peer, "url": self.url} if self.peer is not None else {}),
        }


class SupervisedModel(Protocol):
    """A model as the rooms of its life see it (starting, the child's run, the slots, the context
    steps, the watchers, this status): ``ManagedModel`` satisfies it. They take this, not the
    class, so the class may import them and none imports it back, not even for annotations."""

    name: str
    # Written by the rooms as the child's life goes on:
    server: ModelServer | None
    plan: LaunchPlan | None
    in_flight: int
    waiting: int
    requests_total: int
    last_used: float
    last_error: str | None
    last_crash: str | None
    last_stderr: list[str]
    failure_kind: str | None
    kill_reason: str | None
    load_seconds: float | None
    loading_since: float | None
    ready_since: float | None
    refused: ResidencyConflict | None
    sleeping: bool
    stalls: int
    warming: bool
    _warm_cause: tuple[str, str | None] | None
    _idle: anyio.Event
    on_ready: list[Callable[[Self], None]]

    @property
    def config(self) -> ModelConfig: ...
    @property
    def policy(self) -> SupervisorConfig: ...
    @property
    def contexts(self) -> ContextKeeper | None: ...
    @property
    def events(self) -> EventBus: ...
    @property
    def admission(self) -> Admission: ...
    @property
    def residency(self) -> Residency: ...
    @property
    def restart(self) -> RestartPolicy: ...
    @property
    def state(self) -> ModelState: ...
    @property
    def state_since(self) -> float: ...
    @property
    def restarts(self) -> int: ...
    @property
    def pressure_evictions(self) -> int: ...
    @property
    def retired(self) -> bool: ...
    @property
    def running(self) -> bool: ...
    @property
    def max_concurrency(self) -> int: ...
    @property
    def queue_limit(self) -> int: ...
    @property
    def ttl(self) -> float: ...
    @property
    def stall_timeout(self) -> float: ...
    @property
    def stop_event(self) -> anyio.Event: ...
    @property
    def _changed(self) -> anyio.Event: ...
    @property
    def _done(self) -> anyio.Event: ...
    @property
    def _plan(self) -> Callable[[Self], Awaitable[LaunchPlan]]: ...

    def stopping(self) -> bool: ...
    def _set_state(self, state: ModelState, **data: Any) -> None: ...
    def _fail(self, reason: str, stderr: list[str], *, kind: str) -> None: ...
    async def unload(self, reason: str = "unload", *, save: bool = True) -> None: ...
    async def wait_ready(self, start: Callable[[Self], None]) -> ModelServer: ...


def model_status(m: SupervisedModel) -> ModelStatus:
    """What the control API reports of ``m`` now."""
    server, plan = m.server, m.plan
    alive = server is not None and server.alive
    ready = m.ready_since is not None and m.state == ModelState.READY
    # Memory is what the model holds now: a stopped or failed model holds none, whatever its
    # last plan said (as placement counts it: ``held_by_models``).
    holds = plan is not None and m.running
    return ModelStatus(
        backend=m.config.backend,
        label=backend_of(m.config).label,
        serves=_serves(m),
        keep_context=m.config.keep_context,
        contexts=_contexts(m),
        failure_kind=m.failure_kind,
        last_stderr=m.last_stderr[-15:],
        log_last=server.log.tail(1)[-1:] if server else [],
        ttl=m.ttl or None,
        ttl_left=_ttl_left(m),
        max_concurrency=m.max_concurrency,
        queue_limit=m.queue_limit,
        requests_total=m.requests_total,
        name=m.name,
        state=m.state,
        since=m.state_since,
        path=m.config.path,
        pid=server.pid if server is not None and alive else None,
        port=server.port if server is not None and alive else None,
        devices=plan.devices if plan else [],
        workers=plan.workers if plan and m.running else [],  # a stopped model holds no worker
        restarts=m.restarts,
        stalls=m.stalls,
        pressure_evictions=m.pressure_evictions,
        sleeping=m.sleeping and alive,
        last_error=m.last_error,
        last_crash=m.last_crash,
        uptime=time.monotonic() - m.ready_since if ready and m.ready_since else None,
        in_flight=m.in_flight,
        waiting=m.waiting,
        load_seconds=m.load_seconds,
        estimated_bytes=plan.estimated_bytes if plan and holds else {},
        actual_bytes=plan.actual.device_totals() if plan and holds else {},
        context_bytes=plan.context_bytes if plan and holds else {},
        log_path=_log_path(m),
        modalities=list(plan.projector.modalities) if plan and plan.projector else [],
        context=_context(m),
        residency=m.residency.to_json(),
        queue=_queue(m),
        variants=[f"{m.name}:{v}" for v in m.config.variants],
        adapters=[f"{m.name}:{a}" for a in m.config.adapters],
    )


def _serves(m: SupervisedModel) -> list[str]:
    """The words of :data:`ROUTE_WORDS` whose route the gateway takes to ``m`` and its child
    answers: its backend's routes (whisper-server's, a command's ``routes``), or, for llama-server,
    which is sent every route, what its child is started as."""
    config, plan = m.config, m.plan
    backend = backend_of(config)
    words = [w for w, path in ROUTE_WORDS.items() if backend.serves(config, path)]
    if backend.routes_of(config) is not None:
        return words
    flags = {normalise_flag(a) for a in config.args}
    if config.rerank or flags & {"--rerank", "--reranking"}:
        return ["rerank"]  # a reranker generates no text
    if plan is not None and plan.info.architecture in EMBEDDING_ARCHITECTURES:
        return ["embeddings"]  # an encoder: embeddings only
    answers = {"chat", "completion"}
    if config.embeddings or flags & {"--embedding", "--embeddings"}:
        answers.add("embeddings")
    if plan is not None and plan.projector is not None and "audio" in plan.projector.modalities:
        answers.add("transcription")  # an audio projector, once the child has it
    return [w for w in words if w in answers]


def _context(m: SupervisedModel) -> dict[str, Any]:
    """The context geometry ``forge ps`` shows: the child's (its plan's estimate, which the child
    was started with) once it has one, else the config's; empty for a model without a context."""
    if not backend_of(m.config).has_slots:  # no llama-server: no context, no slots
        return {}
    auto = m.policy.ctx_size_of(m.config) == "auto"
    if m.plan is not None:
        est = m.plan.estimate
        chosen = m.plan.decision.context  # ctx_size = "auto": what this child's load chose
        return {
            "ctx_size": est.ctx_size,
            "parallel": est.parallel,
            "kv_unified": est.kv_unified,
            "per_request": est.ctx_per_request,
            **({"auto": chosen.to_json()} if chosen is not None else {}),
        }
    c = m.config
    ctx = m.policy.ctx_size_of(c)
    return {
        "ctx_size": ctx if isinstance(ctx, int) and ctx else None,
        "parallel": c.parallel or 4,
        "kv_unified": c.unified_kv,
        "per_request": m.policy.per_request_of(c),
        **({"auto": {"ctx_min": m.policy.ctx_min_of(c)}} if auto else {}),
    }


def _log_path(m: SupervisedModel) -> str | None:
    """The file the model's child writes: the plan's, or ``NAME.PID.log`` when another process
    held that one (see ``process._logs``)."""
    if m.server is not None and m.server.log.path is not None:
        return str(m.server.log.path)
    return str(m.plan.spec.log_path) if m.plan and m.plan.spec.log_path else None


def loaded_model(m: SupervisedModel) -> LoadedModel | None:
    """``m`` as placement counts it (``ManagedModel.as_loaded``), or None when it holds no memory."""
    plan = m.plan
    if plan is None or not m.running:
        return None
    ready = m.state == ModelState.READY
    held = plan.held_bytes() if ready else dict(plan.estimated_bytes)
    return LoadedModel(
        name=m.name,
        devices=tuple(plan.devices),
        bytes_by_device=held,
        # A model still loading is busy: never evicted, and not yet in the counters.
        in_flight=m.in_flight + m.waiting + (0 if ready else 1),
        last_used=m.last_used,
        counted=ready,
        residency=m.residency,
    )


def _ttl_left(m: SupervisedModel) -> float | None:
    """Seconds until the TTL unloads an idle ready model; the full TTL while it is busy."""
    if m.ttl <= 0 or m.state != ModelState.READY:
        return None
    if m.in_flight or m.waiting:
        return m.ttl
    return max(0.0, m.ttl - (time.monotonic() - m.last_used))


def _contexts(m: SupervisedModel) -> dict[str, Any]:
    """Saved contexts on disk, and what this run saved and restored (``/metrics`` reads these)."""
    if m.contexts is None:
        return {}
    conversations: dict[str, Any] = {}
    if m.config.keep_conversations:  # the tier's totals, and why it is off when it turned itself off
        conversations = {f"conversation_{k}": v for k, v in asdict(m.contexts.conversations).items()}
        conversations["conversation_off"] = m.contexts.book.off
    return {**m.contexts.summary().to_json(), **asdict(m.contexts.counters), **conversations}


def _queue(m: SupervisedModel) -> dict[str, Any]:
    """The admission queue per class and per key (``/metrics``, ``forge ps`` and the page)."""
    a = m.admission
    return {
        "waiting": a.waiting_by_class(),
        "in_flight": a.in_flight_by_class(),
        "waiting_by_key": a.waiting_by_key(),
        "interactive_slots": a.interactive_slots,
    }
