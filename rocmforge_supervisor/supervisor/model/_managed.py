"""One configured model under supervision: its child's life, restarts, health, TTL and queue.

The whole life of the model's current child runs in :meth:`ManagedModel.run`, a task in the
supervisor's task group: the one restart loop (``process.restart_loop``, which ``forge worker``'s
rpc-servers run too) with this model's steps: plan a start (:meth:`prepare`: placement, in
:mod:`._starting`), run the child until it exits (:meth:`live`: context restore, the watchers, in
:mod:`._child_run`), and on a crash either the breaker opens (:meth:`crash_loop`) or a restart is
announced (:meth:`restarting`) and the backoff waited. Requests only wait on state changes and
take a slot of the model's admission queue (:mod:`._acquire`, :mod:`._admission`: priority
classes, fair between keys). The states and the moves between them are in :mod:`._status`;
``keep_context``'s saves and restores in :mod:`._context_steps`. Nothing here formats HTTP (errors
are typed and mapped at the edge) or signals a process (``ModelServer`` does).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import anyio
import anyio.abc

from ..._errors import ResidencyConflict
from ...config import ModelConfig, SupervisorConfig
from ...process import Breaker, ModelServer, Outcome, RestartPolicy, restart_loop
from .._events import EventBus, EventKind
from ..admission._admission import Admission, PriorityClass
from ..contexts._keep_context import ContextKeeper
from ..launch._launch import LaunchPlan
from ..placement._placement import LoadedModel
from ..placement._residency import Residency
from ._acquire import acquire_slot, wait_until_ready
from ._child_run import run_child
from ._context_steps import keeps_context, save_context, snapshot_context
from ._starting import plan_start
from ._status import ModelState, ModelStatus, check_transition, loaded_model, model_status

__all__ = ["ManagedModel", "PlanFn"]

log = logging.getLogger("rocmforge.supervisor")

PlanFn = Callable[["ManagedModel"], Awaitable[LaunchPlan]]


class ManagedModel:
    """One ``[models.NAME]`` entry: at most one child at a time, restarted with backoff until a
    crash loop opens its breaker; requests queue for its concurrency slots."""

    def __init__(
        self,
        name: str,
        config: ModelConfig,
        *,
        policy: SupervisorConfig,
        events: EventBus,
        plan: PlanFn,
        fingerprint: str = "",
        contexts: ContextKeeper | None = None,
    ) -> None:
        self.name, self.config, self.policy, self.fingerprint = name, config, policy, fingerprint
        #: Its saved KV-cache slots (``keep_context``); None in tests that build a bare model.
        self.contexts = contexts
        self._events, self._plan = events, plan
        self.state = ModelState.UNLOADED
        self.state_since = time.time()
        self.restarts = 0
        self.stalls = 0  # children killed by the progress watchdog
        self.pressure_evictions = 0  # unloads to yield memory to other programs (vram_reserve)
        self.sleeping = False  # the child freed its model after sleep_idle idle seconds (/props)
        #: Why a watcher killed the child (a stall), for its crash record.
        self.kill_reason: str | None = None
        self.last_error: str | None = None
        #: Why the child last ended before the one that runs now (kept after a recovery).
        self.last_crash: str | None = None
        self.last_stderr: list[str] = []
        self.restart = RestartPolicy(
            backoff_initial=policy.restart_backoff_initial,
            backoff_max=policy.restart_backoff_max,
            crash_loop_max=policy.crash_loop_max,
            crash_loop_window=policy.crash_loop_window,
        )
        self.server: ModelServer | None = None
        self.plan: LaunchPlan | None = None
        self.in_flight = self.waiting = self.requests_total = 0
        self.last_used = time.monotonic()
        self.ready_since: float | None = None
        self.load_seconds: float | None = None
        self.loading_since: float | None = None
        #: Who gets the next free slot: priority classes, round robin between keys (``_admission``).
        self.admission = Admission(
            self.max_concurrency, interactive_slots=config.interactive_slots, aging=policy.priority_aging
        )
        self._changed = anyio.Event()
        self._stop_requested = False
        self._stop_event = anyio.Event()
        self._running = False
        self._done = anyio.Event()
        self._idle = anyio.Event()
        self._idle.set()
        self._drain_scope: anyio.CancelScope | None = None
        #: Set when a reload removed or replaced this model: it must never start again.
        self.retired = False
        #: Why the breaker opened: placement, oom, timeout, invalid, crash_loop, internal, …
        self.failure_kind: str | None = None
        self.on_ready: list[Callable[[ManagedModel], None]] = []
        #: Idle seconds a client asked for (Ollama's ``keep_alive``); the config's ``ttl`` wins.
        self.ttl_hint: float | None = None
        #: Its residency rules (pinned, swap, evict_cost, group, default): set by the supervisor.
        self.residency = Residency(pinned=config.pinned, never_swap=config.swap == "never")
        #: A start without a request (the warm default): it never evicts, and gives up quietly.
        self.warming = False
        #: The residency rule that refused the last start (409 to the requests that waited on it).
        self.refused: ResidencyConflict | None = None
        #: Why the warm default last stayed unloaded (its error's type and rule): logged once.
        self._warm_cause: tuple[str, str | None] | None = None

    # -- configuration that may change in place on reload --------------------------------------

    @property
    def max_concurrency(self) -> int:
        return self.config.effective_max_concurrency

    @property
    def queue_limit(self) -> int:
        return self.config.queue

    @property
    def ttl(self) -> float:
        """The configured ``ttl``; without one, a client's hint (Ollama's ``keep_alive``)."""
        return float(self.config.ttl or self.ttl_hint or 0)

    def update_limits(self, config: ModelConfig) -> None:
        """A reload that changed only ttl/queue/max_concurrency: keep the child, change the limits."""
        self.config = config
        # Slots held stay held; the next grants follow the new limits.
        self.admission.resize(self.max_concurrency, config.interactive_slots, self.policy.priority_aging)

    # -- state ---------------------------------------------------------------------------------

    def set_policy(self, policy: SupervisorConfig) -> None:
        """A reload's new ``[supervisor]`` section: applies from the next start/crash on."""
        self.policy = policy
        self.admission.aging = policy.priority_aging
        self.restart.configure(
            backoff_initial=policy.restart_backoff_initial,
            backoff_max=policy.restart_backoff_max,
            crash_loop_max=policy.crash_loop_max,
            crash_loop_window=policy.crash_loop_window,
        )

    @property
    def breaker(self) -> Breaker:
        """The restart policy's crash breaker."""
        return self.restart.breaker

    @property
    def running(self) -> bool:
        return self._running

    async def changed(self) -> None:
        await self._changed.wait()  # until the next state change

    async def settled(self) -> ModelState:
        """Until ready, failed or stopped (a start has come to an end, either way)."""
        while self.state not in (ModelState.READY, ModelState.FAILED, ModelState.STOPPED):
            await self._changed.wait()
        return self.state

    @property
    def events(self) -> EventBus:
        """Where its events go (the watchers publish theirs here too)."""
        return self._events

    def _set_state(self, state: ModelState, **data: Any) -> None:
        check_transition(self.state, state)
        if state != self.state:
            log.info(
                "model %s: %s → %s", self.name, self.state.value, state.value, extra={"model": self.name}
            )
        self.state = state
        self.state_since = time.time()
        self._events.publish(self.name, EventKind.STATE, state.value, **data)
        changed, self._changed = self._changed, anyio.Event()
        changed.set()

    def status(self) -> ModelStatus:
        return model_status(self)

    def as_loaded(self) -> LoadedModel | None:
        """This model as placement counts it, or None when it holds no memory."""
        return loaded_model(self)

    # -- the child's life ----------------------------------------------------------------------

    def reset(self) -> None:
        """Close the breaker (``forge load NAME`` or a reload): the next request may start it."""
        self.breaker.reset()
        if self.state == ModelState.FAILED:
            self.last_error = None
            self._set_state(ModelState.UNLOADED)

    def start_in(self, tg: anyio.abc.TaskGroup) -> None:
        if self._running:
            return
        self._running = True
        self._stop_requested = False
        self._stop_event = anyio.Event()
        self._done = anyio.Event()
        tg.start_soon(self.run, name=f"model {self.name}")

    async def run(self) -> None:
        """Start, watch, restart with backoff — until stopped or the breaker opens: the one restart
        loop (``process.restart_loop``) with this model's steps (:meth:`prepare`, :meth:`live`)."""
        self._running = True
        try:
            await restart_loop(self, self.restart)
        finally:
            with anyio.CancelScope(shield=True):
                await self._cleanup()

    # -- the steps the restart loop takes (process.Life) ---------------------------------------

    @property
    def stop_event(self) -> anyio.Event:
        return self._stop_event

    def stopping(self) -> bool:
        return self._stop_requested

    async def prepare(self) -> LaunchPlan | None:
        return await plan_start(self)

    async def live(self, plan: LaunchPlan) -> Outcome:
        return await run_child(self, plan)

    def crash_loop(self, policy: RestartPolicy) -> None:
        self.server = None
        self._fail(
            f"{policy.breaker.crashes} crashes in {policy.breaker.window:g} s; last: {self.last_error}",
            self.last_stderr,
            kind="crash_loop",
        )

    def restarting(self, delay: float) -> None:
        self.server = None
        self.restarts += 1
        self._events.publish(self.name, EventKind.RESTART, backoff=delay, restarts=self.restarts)
        # No child now: say so (not "ready") while the backoff runs.
        self._set_state(ModelState.LOADING, restarts=self.restarts, restarting_in=delay)

    async def _cleanup(self) -> None:
        if self.server is not None:
            await self.server.stop(timeout=self.policy.stop_timeout)
        self.server = None
        self._running = False
        if self.state != ModelState.FAILED:
            self._set_state(ModelState.STOPPED)
        self._done.set()

    def _fail(self, reason: str, stderr: list[str], *, kind: str) -> None:
        """The breaker opens: the model stays failed until reset, with its reason."""
        self.failure_kind = kind
        self.last_error = reason
        self.last_stderr = stderr
        self._set_state(ModelState.FAILED, error=reason)
        log.error("model %s failed: %s", self.name, reason, extra={"model": self.name})

    @property
    def stall_timeout(self) -> float:
        own = self.config.stall_timeout
        return self.policy.stall_timeout if own is None else own

    async def snapshot_context(self) -> None:
        """Save the running child's slots for a reload's replacement (:mod:`._context_steps`)."""
        await snapshot_context(self)

    async def unload(self, reason: str = "unload", *, save: bool = True) -> None:
        """Drain in-flight requests (bounded), save the slots (``keep_context``; not with
        ``save=False``: ``--forget``), then stop the child. Idempotent."""
        if not self._running:
            if self.state == ModelState.FAILED and reason == "unload":
                self.reset()
            return
        self._stop_requested = True
        self._stop_event.set()
        save = save and self.state == ModelState.READY  # a child still loading has nothing to keep
        if self.state == ModelState.READY:
            self._set_state(ModelState.DRAINING, reason=reason)
            with anyio.move_on_after(self.policy.drain_timeout) as self._drain_scope:
                await self._idle.wait()
            self._drain_scope = None
        server = self.server
        if server is not None:
            grace = await save_context(self, server, reason) if save else self.policy.stop_timeout
            await server.stop(timeout=grace)
        await self._done.wait()
        if self.contexts is not None and keeps_context(self, self.plan):
            self.contexts.after_stop()

    def cut_drain(self) -> None:
        """End a drain in progress now (a forced exit): requests still in flight are cut off."""
        if self._drain_scope is not None:
            self._drain_scope.cancel()

    # -- requests ------------------------------------------------------------------------------

    async def wait_ready(self, start: Callable[[ManagedModel], None]) -> ModelServer:
        """Until ready, starting the child when nothing runs (:func:`~._acquire.wait_until_ready`)."""
        return await wait_until_ready(self, start)

    async def child_gone(self, timeout: float) -> None:
        """After a request found the child unreachable: until its death has been noticed (at most
        ``timeout``), so that a retry waits for the replacement instead of being handed the dead
        child while the state still says ready."""
        server = self.server
        if server is None:
            return
        with anyio.move_on_after(timeout):
            await server.exited.wait()

    def acquire(
        self,
        start: Callable[[ManagedModel], None],
        load_wait: float | None = None,
        loaded: Callable[[], None] | None = None,
        priority: PriorityClass = "interactive",
        key: str | None = None,
    ) -> AbstractAsyncContextManager[ModelServer]:
        """A slot at the child for one request, fair between priority classes and keys
        (:func:`~._acquire.acquire_slot`)."""
        return acquire_slot(self, start, load_wait, loaded, priority, key)
