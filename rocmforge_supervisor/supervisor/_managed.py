"""One configured model under supervision: its child's life, restarts, health, TTL and queue.

The whole life of the model's current child runs in :meth:`ManagedModel.run`, a task in the
supervisor's task group: the one restart loop (``process.restart_loop``, which ``forge worker``'s
rpc-servers run too) with this model's steps: plan a start (:meth:`prepare`: placement), run the
child until it exits (:meth:`live`: context restore, the watchers), and on a crash either the
breaker opens (:meth:`crash_loop`) or a restart is announced (:meth:`restarting`) and the backoff
waited. Requests only wait on state changes and take a slot of the model's admission queue
(:mod:`._admission`: priority classes, fair between keys). The states and the moves between them are in :mod:`._status`. Nothing here
formats HTTP (errors are typed and mapped at the edge) or signals a process (``LlamaServer`` does).
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.abc

from .._errors import (
    ForgeError,
    ModelFailed,
    ModelNotFound,
    ModelRetired,
    PlacementError,
    QueueFull,
    ResidencyBusy,
    ResidencyConflict,
    StartFailed,
)
from ..config import ModelConfig, SupervisorConfig
from ..hardware import cpu_flags
from ..process import (
    Breaker,
    LlamaServer,
    Outcome,
    RestartPolicy,
    describe_returncode,
    restart_loop,
    unwrap_group,
)
from ._admission import Admission, PriorityClass
from ._backends import backend_of
from ._events import EventBus, EventKind
from ._keep_context import ContextKeeper
from ._launch import LaunchPlan
from ._loading import wait_ready_within
from ._placement import LoadedModel
from ._remote import WorkersUnavailable
from ._residency import Residency
from ._status import ModelState, ModelStatus, check_transition, model_status
from ._watchers import watch_health, watch_progress, watch_sleep, watch_ttl

__all__ = ["ManagedModel", "PlanFn"]

log = logging.getLogger("rocmforge.supervisor")

PlanFn = Callable[["ManagedModel"], Awaitable[LaunchPlan]]

#: Planned stops whose slots are not worth saving (the model is gone from the config).
#: Seconds between re-plans while a group's members are all busy.
_GROUP_POLL = 0.5

_NO_SAVE = frozenset({"removed", "failed replacement"})

#: Start failures that a restart cannot fix: the model fails at once, with the reason.
_FATAL_START = frozenset(
    {"file_not_found", "invalid_model", "unsupported", "bad_args", "illegal_instruction", "amx_fault"}
)


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
        self.server: LlamaServer | None = None
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
        plan = self.plan
        if plan is None or not self._running:
            return None
        ready = self.state == ModelState.READY
        held = plan.held_bytes() if ready else dict(plan.estimated_bytes)
        return LoadedModel(
            name=self.name,
            devices=tuple(plan.devices),
            bytes_by_device=held,
            # A model still loading is busy: never evicted, and not yet in the counters.
            in_flight=self.in_flight + self.waiting + (0 if ready else 1),
            last_used=self.last_used,
            counted=ready,
            residency=self.residency,
        )

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
        return await self._plan_start()

    async def live(self, plan: LaunchPlan) -> Outcome:
        return await self._run_child(plan)

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

    async def _plan_start(self) -> LaunchPlan | None:
        """Step 1: the launch plan (placement may evict others); None when it cannot be made."""
        if self.state != ModelState.LOADING:
            self._set_state(ModelState.LOADING, restarts=self.restarts)
        self.loading_since = time.monotonic()
        waiting = False  # for its group's busy members: said once
        while not self._stop_requested:
            try:
                return await self._plan(self)
            except WorkersUnavailable as exc:  # workers down or busy, not a broken model: re-plan
                self.last_error = str(exc)
                self._events.publish(self.name, EventKind.WAITING, reason="workers", message=exc.message)
                self._set_state(ModelState.LOADING, waiting_for="workers", retry_in=self.restart.delay)
                await self._wait_backoff()
            except ResidencyBusy as exc:  # its group's members are busy: re-plan when one is idle
                if self.warming:
                    self._gave_up_warming(exc)
                    return None
                if not waiting:
                    waiting = True
                    self._events.publish(self.name, EventKind.WAITING, reason="group", rule=exc.rule)
                    self._set_state(ModelState.LOADING, waiting_for="group", message=exc.message)
                # Polled: a member going idle is another model's event; a load waits seconds anyway.
                with anyio.move_on_after(_GROUP_POLL):
                    await self._stop_event.wait()
            except ResidencyConflict as exc:  # a rule forbids it now: refused, not failed
                if self.warming:
                    self._gave_up_warming(exc)
                    return None
                self.refused = exc
                self.last_error = str(exc)
                self._events.publish(self.name, EventKind.REFUSED, rule=exc.rule, message=exc.message)
                log.warning("model %s: load refused: %s", self.name, exc, extra={"model": self.name})
                return None
            except ForgeError as exc:
                if self.warming and isinstance(exc, PlacementError):
                    self._gave_up_warming(exc)
                    return None
                kind = (
                    "placement"
                    if isinstance(exc, PlacementError)
                    else "file_not_found"
                    if isinstance(exc, ModelNotFound)
                    else "invalid"
                )
                self._fail(str(exc), [], kind=kind)
                return None
            except Exception as exc:  # a bug must fail this model, not the whole service
                log.exception("model %s: planning the start failed", self.name)
                self._fail(f"internal error while planning the start: {exc!r}", [], kind="internal")
                return None
        return None

    async def _run_child(self, plan: LaunchPlan) -> Outcome:
        """Step 2: one child, from spawn to exit. Returns how it ended."""
        self.plan = plan
        server = LlamaServer(plan.spec)
        self.server = server
        try:
            async with anyio.create_task_group() as tg:
                await tg.start(server.run)
                if not self._stop_requested:  # a stop asked during the load: never announced ready
                    await self._restore_context(server, plan)
                    self._on_ready(server)
                tg.start_soon(watch_health, self, server)
                if backend_of(self.config).has_slots:  # whisper-server, a command: no /slots to watch
                    tg.start_soon(watch_progress, self, server)
                tg.start_soon(watch_ttl, self)
                if self.config.sleep_idle:
                    tg.start_soon(watch_sleep, self, server)
                await server.exited.wait()
                tg.cancel_scope.cancel()
        except BaseException as exc:
            inner = unwrap_group(exc)
            if server.died_unasked and isinstance(inner, Exception) and not isinstance(inner, StartFailed):
                # Something broke while the child was dying (issue 19, 5: an unmapped error from a
                # connection to it). The child's own exit is the reason; the error goes to the log.
                log.warning("model %s: %r as its child died", self.name, inner, exc_info=inner)
                return self._crashed(server)
            return self._start_failed(inner, exc)
        return self._crashed(server)

    def _crashed(self, server: LlamaServer) -> Outcome:
        """The child is gone: its exit (and what its log says about why) is the crash's reason."""
        if self._stop_requested:
            return Outcome.STOPPED
        how = describe_returncode(server.returncode)
        if self.kill_reason is not None:  # we killed it (a stall): that is the cause
            how, self.kill_reason = f"{how}: {self.kill_reason}", None
        # What its log and its exit say about why (an RPC worker it placed layers on died; a CPU
        # fault): the kind's crash advice.
        cause = server.crash_cause(amx="amx_int8" in cpu_flags())
        self.last_error = f"llama-server {how}" + (f": {cause}" if cause else "")
        self.last_stderr = server.log.tail(15)
        self._events.publish(
            self.name, EventKind.CRASH, returncode=server.returncode, message=self.last_error
        )
        log.warning("model %s: child %s", self.name, how, extra={"model": self.name})
        if self.ready_since:
            self.restart.ran_for(time.monotonic() - self.ready_since)  # stable long enough: start over
        return Outcome.CRASHED

    def _keeps_context(self, plan: LaunchPlan | None) -> bool:
        """The child was started to keep its context (``--slot-save-path`` in its flags)."""
        return self.contexts is not None and plan is not None and plan.slot_save_dir is not None

    async def _restore_context(self, server: LlamaServer, plan: LaunchPlan) -> None:
        """Saved slots back into the new child before ``ready`` lets the first request through."""
        if self._keeps_context(plan) and self.contexts is not None and not self._stop_requested:
            await self.contexts.restore(server, plan)

    async def _save_context(self, server: LlamaServer, reason: str) -> float:
        """At a planned stop: save the slots within ``stop_timeout``. Returns the seconds left of
        it for the stop itself (at least 1 s of grace: the save never takes the child's SIGTERM
        grace away entirely)."""
        budget = self.policy.stop_timeout
        plan = self.plan
        if reason in _NO_SAVE or not self._keeps_context(plan) or not server.alive:
            return budget
        if self.sleeping:  # sleeping freed the KV cache, and a save would wake (reload) the model
            return budget
        assert self.contexts is not None and plan is not None
        started = time.monotonic()
        await self.contexts.save(server, plan, timeout=budget)
        return max(1.0, budget - (time.monotonic() - started))

    async def snapshot_context(self) -> None:
        """Save the slots of the running child without stopping it (bounded by ``stop_timeout``):
        a reload's replacement restores them while this child still serves (start-new-first)."""
        server = self.server
        if self.state == ModelState.READY and server is not None:
            await self._save_context(server, "reload")

    def _on_ready(self, server: LlamaServer) -> None:
        # Recovered: the last crash is history (``last_crash``, the events, ``restarts``), not
        # the model's present error.
        if self.last_error is not None:
            self.last_crash = self.last_error
        self.last_error, self.failure_kind = None, None
        self.warming = False  # loaded: its restarts place it like any start
        self._warm_cause = None
        self.load_seconds = server.load_seconds
        self.ready_since = self.last_used = time.monotonic()
        self._set_state(ModelState.READY, pid=server.pid, port=server.port, load_seconds=server.load_seconds)
        for cb in self.on_ready:
            cb(self)

    def _gave_up_warming(self, exc: PlacementError) -> None:
        """The warm default does not fit now (or would unload another model): no failure, no
        refusal; the supervisor tries again when memory is freed. Why is logged once per cause
        (a rule, or memory), not at every try."""
        cause = (type(exc).__name__, getattr(exc, "rule", None))
        level = logging.DEBUG if cause == self._warm_cause else logging.INFO
        self._warm_cause = cause
        log.log(
            level,
            "model %s: the warm default stays unloaded for now: %s",
            self.name,
            exc,
            extra={"model": self.name},
        )
        return None

    def _start_failed(self, inner: BaseException, exc: BaseException) -> Outcome:
        """A start that did not come up (or a bug while supervising)."""
        if not isinstance(inner, StartFailed):
            if isinstance(inner, Exception):  # a bug: fail this model, keep the service
                log.exception("model %s: supervision failed", self.name, exc_info=inner)
                self._fail(f"internal error: {inner!r}", [], kind="internal")
                return Outcome.FAILED
            raise exc  # cancellation and the like: not ours to handle
        if self._stop_requested:  # a requested stop during the load is no crash
            return Outcome.STOPPED
        self.last_error = str(inner)
        self.last_stderr = inner.stderr_tail
        self._events.publish(self.name, EventKind.CRASH, reason=inner.reason, message=inner.message)
        if inner.reason in _FATAL_START:  # restarting cannot fix the input
            self._fail(str(inner), inner.stderr_tail, kind=inner.reason)
            return Outcome.FAILED
        return Outcome.CRASHED

    async def _wait_backoff(self) -> None:
        """Step 4: wait before the next start (an unload ends the wait), then double it."""
        await self.restart.wait(self._stop_event)

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
            grace = await self._save_context(server, reason) if save else self.policy.stop_timeout
            await server.stop(timeout=grace)
        await self._done.wait()
        if self.contexts is not None and self._keeps_context(self.plan):
            self.contexts.after_stop()

    def cut_drain(self) -> None:
        """End a drain in progress now (a forced exit): requests still in flight are cut off."""
        if self._drain_scope is not None:
            self._drain_scope.cancel()

    # -- requests ------------------------------------------------------------------------------

    async def wait_ready(self, start: Callable[[ManagedModel], None]) -> LlamaServer:
        """Until ready; starts the child (via ``start``) when nothing runs. Raises when it failed."""
        joined = False  # a start this waiter caused or waited on: its refusal is this one's
        while True:
            if self.retired:
                raise ModelRetired(f"model {self.name!r} was replaced or removed", hint="retry")
            server = self.server
            if self.state == ModelState.READY and server is not None and server.serving:
                return server
            if self.state == ModelState.FAILED:
                raise ModelFailed(
                    f"model {self.name!r} failed: {self.last_error}",
                    kind=self.failure_kind,
                    hint=f"fix the cause, then `forge load {self.name}` or reload the config",
                )
            if joined and not self._running and self.refused is not None:
                raise self.refused.again()
            changed = self._changed
            joined = joined or self._running
            if not self._running:
                self.refused = None  # a new start: the rules are asked again
                self.warming = False
                start(self)
                joined = True
            elif self.state == ModelState.DRAINING:
                await self._done.wait()
                continue
            await changed.wait()

    async def child_gone(self, timeout: float) -> None:
        """After a request found the child unreachable: until its death has been noticed (at most
        ``timeout``), so that a retry waits for the replacement instead of being handed the dead
        child while the state still says ready."""
        server = self.server
        if server is None:
            return
        with anyio.move_on_after(timeout):
            await server.exited.wait()

    @asynccontextmanager
    async def acquire(
        self,
        start: Callable[[ManagedModel], None],
        load_wait: float | None = None,
        loaded: Callable[[], None] | None = None,
        priority: PriorityClass = "interactive",
        key: str | None = None,
    ) -> AsyncIterator[LlamaServer]:
        """A slot at the child for one request: waits for load (``loaded`` is called once it is
        ready) and for the concurrency limit, in its ``priority`` class, fair between ``key``s
        (the API key's name; see :mod:`._admission`)."""
        # Only what is beyond the in-flight limit waits in the queue: `queue = 0` admits a request
        # while a slot is free (or will be, once the model loads) and refuses only the surplus.
        # The admission holds the in-flight limit resolved from the config (at start and at each
        # ``update_limits``): read there, not worked out again per request.
        if self.in_flight + self.waiting >= self.admission.slots + self.queue_limit:
            raise QueueFull(
                f"model {self.name!r} has {self.in_flight} requests in flight and {self.waiting} "
                f"waiting (max_concurrency = {self.max_concurrency}, queue = {self.queue_limit})",
                retry_after=1.0,
                hint="retry later, or raise the model's queue / max_concurrency",
            )
        self.waiting += 1
        try:
            while True:
                server = self.server
                # Every request to a loaded model: no load to wait for, no timeout scope to build.
                if self.state != ModelState.READY or self.retired or server is None or not server.serving:
                    server = await wait_ready_within(self, start, load_wait)
                if loaded is not None:
                    loaded()
                admission = self.admission
                await admission.take(priority, key)
                # The wait for a slot can be long: the child may have died, or the model may be
                # draining by now. Then give the slot back and wait for the next ready child.
                # (A child the watchdog just killed is alive until its exit is noticed: not serving.)
                if self.state == ModelState.READY and server is self.server and server.serving:
                    break
                admission.give(priority, key)
        finally:
            self.waiting -= 1
        self.in_flight += 1
        self.requests_total += 1
        if self._idle.is_set():
            self._idle = anyio.Event()
        try:
            yield server
        finally:
            self.in_flight -= 1
            admission.give(priority, key)
            self.last_used = time.monotonic()
            if self.in_flight == 0:
                self._idle.set()
