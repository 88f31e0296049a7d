"""One configured model under supervision: its state machine, restarts, health, TTL and queue.

States::

    unloaded → loading → ready → draining → stopped
                  ↑        │
                  └────────┘  crash / hang: restart after backoff (1 s → 60 s)
    loading/ready → failed    the crash-loop breaker opened (N crashes in a window); reason kept

The whole life of the model's current child runs in :meth:`ManagedModel.run`, a task in the
supervisor's task group; requests only wait on state changes and take a slot of the model's
concurrency semaphore. Nothing here formats HTTP: errors are typed and mapped at the edge.
"""

from __future__ import annotations

import collections
import logging
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import anyio

from .._errors import ForgeError, PlacementError, QueueFull, ServiceError, StartFailed
from ..process import InstanceSpec, LlamaServer, crash_cause, describe_returncode, unwrap_group
from ._events import EventBus
from ._loading import wait_ready_within
from ._remote import WorkersUnavailable

__all__ = ["ManagedModel", "ModelRetired", "ModelState", "Prepared", "SupervisionPolicy"]

log = logging.getLogger("rocmforge.supervisor")


class ModelRetired(ServiceError):
    """The model object was replaced or removed by a reload: look the name up again."""


class ModelState(StrEnum):
    UNLOADED = "unloaded"
    LOADING = "loading"
    READY = "ready"
    DRAINING = "draining"
    STOPPED = "stopped"
    FAILED = "failed"


@dataclass(frozen=True)
class SupervisionPolicy:
    restart_backoff_initial: float = 1.0
    restart_backoff_max: float = 60.0
    crash_loop_max: int = 5
    crash_loop_window: float = 300.0
    health_interval: float = 5.0
    health_failures: int = 3
    load_stall_timeout: float = 300.0
    stop_timeout: float = 10.0
    drain_timeout: float = 30.0
    #: The whole load's deadline is base + per GiB of model file (LocalAI: 5 min + 20 s/GiB):
    #: big models on slow disks must not hit a fixed timeout (lemonade#674, #1594, #3386).
    load_deadline_base: float = 300.0
    load_deadline_per_gib: float = 20.0

    def load_deadline(self, size_bytes: int) -> float:
        return self.load_deadline_base + self.load_deadline_per_gib * size_bytes / 2**30


@dataclass
class Prepared:
    """What the supervisor decided for one start: the spec, the devices, the memory estimate."""

    spec: InstanceSpec
    devices: list[str]
    estimated_bytes: dict[str, int] = field(default_factory=dict)
    actual: Any = None  # an allocation accumulator fed by the child's log lines
    workers: list[dict[str, object]] = field(default_factory=list)  # RPC workers' shares, if any
    skipped_workers: dict[str, str] = field(default_factory=dict)  # configured ones left out, and why


PrepareFn = Callable[["ManagedModel"], Awaitable[Prepared]]


class ManagedModel:
    def __init__(
        self,
        name: str,
        config: Any,
        *,
        policy: SupervisionPolicy,
        events: EventBus,
        prepare: PrepareFn,
        fingerprint: str = "",
    ) -> None:
        self.name = name
        self.config = config
        self.policy = policy
        self.fingerprint = fingerprint
        self._events = events
        self._prepare = prepare
        self.state = ModelState.UNLOADED
        self.state_since = time.time()
        self.restarts = 0
        self.last_error: str | None = None
        self.last_stderr: list[str] = []
        self.crash_times: collections.deque[float] = collections.deque()
        self.server: LlamaServer | None = None
        self.prepared: Prepared | None = None
        self.in_flight = 0
        self.waiting = 0
        self.last_used = time.monotonic()
        self.ready_since: float | None = None
        self.load_seconds: float | None = None
        self.loading_since: float | None = None
        self.requests_total = 0
        self._slots = anyio.Semaphore(self.max_concurrency)
        self._changed = anyio.Event()
        self._stop_requested = False
        self._stop_event = anyio.Event()
        self._running = False
        self._done = anyio.Event()
        self._idle = anyio.Event()
        self._idle.set()
        #: Set when a reload removed or replaced this model: it must never start again.
        self.retired = False
        #: Why the breaker opened: placement, oom, timeout, invalid, crash_loop, internal, …
        self.failure_kind: str | None = None
        self.on_ready: list[Callable[[ManagedModel], None]] = []
        #: Idle seconds a client asked for (Ollama's ``keep_alive``); the config's ``ttl`` wins.
        self.ttl_hint: float | None = None

    # -- configuration that may change in place on reload --------------------------------------

    @property
    def max_concurrency(self) -> int:
        return int(self.config.effective_max_concurrency)

    @property
    def queue_limit(self) -> int:
        return int(self.config.queue)

    @property
    def ttl(self) -> float:
        """The configured ``ttl``; without one, a client's hint (Ollama's ``keep_alive``)."""
        return float(self.config.ttl or self.ttl_hint or 0)

    def update_limits(self, config: Any) -> None:
        """A reload that changed only ttl/queue/max_concurrency: keep the child, change the limits."""
        old = self.max_concurrency
        self.config = config
        new = self.max_concurrency
        if new != old:
            # Requests holding the old semaphore release into it; new ones use the new size.
            self._slots = anyio.Semaphore(new)

    # -- state ---------------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._running

    def _set_state(self, state: ModelState, **data: Any) -> None:
        if state != self.state:
            log.info(
                "model %s: %s → %s", self.name, self.state.value, state.value, extra={"model": self.name}
            )
        self.state = state
        self.state_since = time.time()
        self._events.publish(self.name, "state", state.value, **data)
        changed, self._changed = self._changed, anyio.Event()
        changed.set()

    def status(self) -> dict[str, Any]:
        server = self.server
        prepared = self.prepared
        actual = None
        if prepared is not None and prepared.actual is not None:
            actual = prepared.actual.device_totals()
        return {
            "name": self.name,
            "state": self.state.value,
            "since": self.state_since,
            "pid": server.pid if server and server.alive else None,
            "port": server.port if server and server.alive else None,
            "devices": prepared.devices if prepared else [],
            "workers": prepared.workers if prepared else [],
            "restarts": self.restarts,
            "last_error": self.last_error,
            "uptime": (time.monotonic() - self.ready_since)
            if self.ready_since and self.state == "ready"
            else None,
            "in_flight": self.in_flight,
            "waiting": self.waiting,
            "load_seconds": self.load_seconds,
            "path": str(getattr(self.config, "path", "")),
            "memory": {
                "estimated_bytes": prepared.estimated_bytes if prepared else {},
                "actual_bytes": actual or {},
            },
            "log_path": str(prepared.spec.log_path) if prepared and prepared.spec.log_path else None,
            # For the status page: why it failed, what the child said last, when TTL unloads it.
            "failure_kind": self.failure_kind,
            "last_stderr": self.last_stderr[-15:],
            "log_last": server.log.tail(1)[-1:] if server else [],
            "ttl": self.ttl or None,
            "ttl_left": self._ttl_left(),
            "max_concurrency": self.max_concurrency,
            "queue_limit": self.queue_limit,
            "requests_total": self.requests_total,
        }

    def _ttl_left(self) -> float | None:
        """Seconds until the TTL unloads an idle ready model; the full TTL while it is busy."""
        if self.ttl <= 0 or self.state != ModelState.READY:
            return None
        if self.in_flight or self.waiting:
            return self.ttl
        return max(0.0, self.ttl - (time.monotonic() - self.last_used))

    # -- the child's life ----------------------------------------------------------------------

    def reset(self) -> None:
        """Close the breaker (``forge load NAME`` or a reload): the next request may start it."""
        self.crash_times.clear()
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
        """Start, watch, restart with backoff — until stopped or the breaker opens."""
        self._running = True
        backoff = self.policy.restart_backoff_initial
        try:
            while not self._stop_requested:
                if self.state != ModelState.LOADING:
                    self._set_state(ModelState.LOADING, restarts=self.restarts)
                self.loading_since = time.monotonic()
                try:
                    prepared = await self._prepare(self)
                except WorkersUnavailable as exc:
                    # Workers down or busy: not a broken model. Wait (backoff) and re-plan.
                    self.last_error = str(exc)
                    self._events.publish(self.name, "waiting", reason="workers", message=exc.message)
                    self._set_state(ModelState.LOADING, waiting_for="workers", retry_in=backoff)
                    with anyio.move_on_after(backoff):
                        await self._stop_event.wait()
                    backoff = min(backoff * 2, self.policy.restart_backoff_max)
                    continue
                except ForgeError as exc:
                    self._open_breaker(
                        str(exc), [], kind="placement" if isinstance(exc, PlacementError) else "invalid"
                    )
                    return
                except Exception as exc:  # a bug must fail this model, not the whole service
                    log.exception("model %s: preparing the start failed", self.name)
                    self._open_breaker(
                        f"internal error while preparing the start: {exc!r}", [], kind="internal"
                    )
                    return
                if self._stop_requested:  # unloaded while we were preparing
                    break
                self.prepared = prepared
                server = LlamaServer(prepared.spec)
                self.server = server
                crashed_at_load = False
                try:
                    async with anyio.create_task_group() as tg:
                        await tg.start(server.run)
                        self.load_seconds = server.load_seconds
                        self.ready_since = time.monotonic()
                        self.last_used = time.monotonic()
                        self._set_state(
                            ModelState.READY,
                            pid=server.pid,
                            port=server.port,
                            load_seconds=server.load_seconds,
                        )
                        for cb in self.on_ready:
                            cb(self)
                        tg.start_soon(self._watch_health, server)
                        tg.start_soon(self._watch_ttl)
                        await server.exited.wait()
                        tg.cancel_scope.cancel()
                except BaseException as exc:
                    inner = unwrap_group(exc)
                    if not isinstance(inner, StartFailed):
                        if isinstance(inner, Exception):  # a bug: fail this model, keep the service
                            log.exception("model %s: supervision failed", self.name)
                            self._open_breaker(f"internal error: {inner!r}", [], kind="internal")
                            return
                        raise
                    if self._stop_requested:  # a requested stop during the load is no crash
                        break
                    crashed_at_load = True
                    self.last_error = str(inner)
                    self.last_stderr = inner.stderr_tail
                    self._events.publish(self.name, "crash", reason=inner.reason, message=inner.message)
                    if inner.reason in ("file_not_found", "invalid_model", "unsupported", "bad_args"):
                        # Restarting cannot fix the input: fail now, with the reason.
                        self._open_breaker(str(inner), inner.stderr_tail, kind=inner.reason)
                        return
                if self._stop_requested:
                    break
                if not crashed_at_load:
                    how = describe_returncode(server.returncode)
                    cause = crash_cause(server.log.tail(40))
                    self.last_error = f"llama-server {how}" + (f": {cause}" if cause else "")
                    self.last_stderr = server.log.tail(15)
                    self._events.publish(
                        self.name, "crash", returncode=server.returncode, message=self.last_error
                    )
                    log.warning("model %s: child %s", self.name, how, extra={"model": self.name})
                    if (
                        self.ready_since
                        and time.monotonic() - self.ready_since > self.policy.restart_backoff_max
                    ):
                        backoff = self.policy.restart_backoff_initial  # it had been stable: start over
                self.server = None
                now = time.monotonic()
                self.crash_times.append(now)
                while self.crash_times and now - self.crash_times[0] > self.policy.crash_loop_window:
                    self.crash_times.popleft()
                if len(self.crash_times) >= self.policy.crash_loop_max:
                    self._open_breaker(
                        f"{len(self.crash_times)} crashes in {self.policy.crash_loop_window:g} s; last: {self.last_error}",
                        self.last_stderr,
                        kind="crash_loop",
                    )
                    return
                self.restarts += 1
                self._events.publish(self.name, "restart", backoff=backoff, restarts=self.restarts)
                # No child now: say so (not "ready") while the backoff runs.
                self._set_state(ModelState.LOADING, restarts=self.restarts, restarting_in=backoff)
                with anyio.move_on_after(backoff):
                    await self._stop_event.wait()
                backoff = min(backoff * 2, self.policy.restart_backoff_max)
        finally:
            with anyio.CancelScope(shield=True):
                if self.server is not None:
                    await self.server.stop(timeout=self.policy.stop_timeout)
                self.server = None
                self._running = False
                if self.state != ModelState.FAILED:
                    self._set_state(ModelState.STOPPED)
                self._done.set()

    def _open_breaker(self, reason: str, stderr: list[str], *, kind: str) -> None:
        self.failure_kind = kind
        self.last_error = reason
        self.last_stderr = stderr
        self._set_state(ModelState.FAILED, error=reason)
        log.error("model %s failed: %s", self.name, reason, extra={"model": self.name})

    async def _watch_health(self, server: LlamaServer) -> None:
        """A child that stops answering /health (SIGSTOP, deadlock) K times in a row is killed."""
        failures = 0
        interval = self.policy.health_interval
        while True:
            await anyio.sleep(interval)
            status = await server.health(timeout=max(0.5, min(interval, 5.0)))
            if status == 200:
                failures = 0
                continue
            failures += 1
            log.warning(
                "model %s: /health check failed (%d/%d)",
                self.name,
                failures,
                self.policy.health_failures,
                extra={"model": self.name},
            )
            if failures >= self.policy.health_failures:
                self._events.publish(self.name, "hang", failures=failures)
                self.last_error = f"no answer to /health {failures} times in a row: killed"
                server.log.note(self.last_error)
                server.signal(signal.SIGKILL)
                return

    async def _watch_ttl(self) -> None:
        while True:
            if self.ttl <= 0:  # no ttl (yet): a client's keep_alive hint may set one later
                await anyio.sleep(1.0)
                continue
            idle_for = time.monotonic() - self.last_used
            if self.in_flight == 0 and self.waiting == 0 and idle_for >= self.ttl:
                self._events.publish(self.name, "ttl", idle_seconds=idle_for)
                await self.unload(reason="ttl")
                return
            await anyio.sleep(max(0.05, self.ttl - idle_for if self.in_flight == 0 else self.ttl))

    async def unload(self, reason: str = "unload") -> None:
        """Drain in-flight requests (bounded), then stop the child. Idempotent."""
        if not self._running:
            if self.state == ModelState.FAILED and reason == "unload":
                self.reset()
            return
        self._stop_requested = True
        self._stop_event.set()
        if self.state == ModelState.READY:
            self._set_state(ModelState.DRAINING, reason=reason)
            with anyio.move_on_after(self.policy.drain_timeout):
                await self._idle.wait()
        server = self.server
        if server is not None:
            await server.stop(timeout=self.policy.stop_timeout)
        await self._done.wait()

    # -- requests ------------------------------------------------------------------------------

    async def wait_ready(self, start: Callable[[ManagedModel], None]) -> LlamaServer:
        """Until ready; starts the child (via ``start``) when nothing runs. Raises when it failed."""
        while True:
            if self.retired:
                raise ModelRetired(f"model {self.name!r} was replaced or removed", hint="retry")
            server = self.server
            if self.state == ModelState.READY and server is not None and server.alive:
                return server
            if self.state == ModelState.FAILED:
                raise ServiceError(
                    f"model {self.name!r} failed: {self.last_error}",
                    hint=f"fix the cause, then `forge load {self.name}` or reload the config",
                )
            changed = self._changed
            if not self._running:
                start(self)
            elif self.state == ModelState.DRAINING:
                await self._done.wait()
                continue
            await changed.wait()

    @asynccontextmanager
    async def acquire(
        self, start: Callable[[ManagedModel], None], load_wait: float | None = None
    ) -> AsyncIterator[LlamaServer]:
        """A slot at the child for one request: waits for load and for the concurrency limit."""
        if self.waiting >= self.queue_limit:
            raise QueueFull(
                f"model {self.name!r} has {self.waiting} requests waiting (queue = {self.queue_limit})",
                retry_after=1.0,
                hint="retry later, or raise the model's queue / max_concurrency",
            )
        self.waiting += 1
        try:
            while True:
                server = await wait_ready_within(self, start, load_wait)
                slots = self._slots
                await slots.acquire()
                # The wait for a slot can be long: the child may have died, or the model may be
                # draining by now. Then give the slot back and wait for the next ready child.
                if self.state == ModelState.READY and server is self.server and server.alive:
                    break
                slots.release()
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
            slots.release()
            self.last_used = time.monotonic()
            if self.in_flight == 0:
                self._idle.set()
