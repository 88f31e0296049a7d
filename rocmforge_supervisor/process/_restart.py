"""The one restart policy (backoff + crash breaker) and event vocabulary of every child forge keeps
running: a model's llama-server (``supervisor/_managed``) and a ``forge worker``'s rpc-servers
(:func:`supervise`) alike.

The policy is a value with a clock, not a loop: the supervisor's model loop has steps of its own
(placement, context restore, health watch) between a crash and the next start, so it asks the
policy; :func:`supervise` is the plain loop for a child with nothing else around it.

What the policy does:

- **backoff**: wait ``delay`` before the next start, then double it, up to ``backoff_max``; a child
  that ran ``stable_after`` seconds before it ended starts the count over.
- **breaker**: ``crash_loop_max`` crashes within ``crash_loop_window`` seconds open it; an open
  breaker means: stop restarting, the input (or the machine) is broken. ``None``: it never opens.

The event names (:class:`ChildEvent`) are the supervisor's, which its control API and page have
always published (``crash``, ``restart``; ``ready`` and ``failed`` as its states): a worker says
the same words for the same things.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from enum import StrEnum
from typing import Protocol

import anyio
import anyio.abc

from .._errors import StartFailed
from ._outcomes import describe_returncode

__all__ = ["Breaker", "ChildEvent", "ChildEventFn", "RestartPolicy", "Restartable", "exit_words", "supervise"]


class ChildEvent(StrEnum):
    """What happened to a supervised child; the values are the supervisor's event and state names."""

    READY = "ready"  # it answers (the supervisor's state ``ready``)
    CRASH = "crash"  # it died, at start or later
    RESTART = "restart"  # a restart is scheduled after the backoff
    FAILED = "failed"  # the breaker opened, or the first start failed for a reason waiting cannot fix


#: Called with (child name, event, detail: a human sentence).
ChildEventFn = Callable[[str, ChildEvent, str], None]


class Breaker:
    """Opens after ``max_crashes`` crashes within ``window`` seconds (a crash loop)."""

    def __init__(self, max_crashes: int, window: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_crashes = max_crashes
        self.window = window
        self._clock = clock
        self._times: collections.deque[float] = collections.deque()

    def record(self) -> bool:
        """Count one crash now; True when that opens the breaker."""
        now = self._clock()
        self._times.append(now)
        while self._times and now - self._times[0] > self.window:
            self._times.popleft()
        return len(self._times) >= self.max_crashes

    @property
    def crashes(self) -> int:
        return len(self._times)

    def reset(self) -> None:
        self._times.clear()


class RestartPolicy:
    """Backoff and breaker for one supervised child (see the module docstring)."""

    def __init__(
        self,
        *,
        backoff_initial: float,
        backoff_max: float,
        crash_loop_max: int | None,
        crash_loop_window: float,
        stable_after: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        #: Ran this long before it ended: it had been stable, the backoff starts over.
        self.stable_after = backoff_max if stable_after is None else stable_after
        self.opens = crash_loop_max is not None
        self.breaker = Breaker(crash_loop_max or 1, crash_loop_window, clock)
        #: The wait before the next start.
        self.delay = backoff_initial

    def configure(
        self, *, backoff_initial: float, backoff_max: float, crash_loop_max: int, crash_loop_window: float
    ) -> None:
        """New numbers (a reload): they apply from the next crash on; the counts are kept."""
        self.backoff_initial, self.backoff_max, self.stable_after = backoff_initial, backoff_max, backoff_max
        self.opens = True
        self.breaker.max_crashes, self.breaker.window = crash_loop_max, crash_loop_window

    def rewind(self) -> None:
        """A fresh run (a start asked for, not a restart): the first wait is the initial one again."""
        self.delay = self.backoff_initial

    def ran_for(self, seconds: float) -> None:
        """The child had been up ``seconds`` when it ended: long enough, and the backoff starts over."""
        if seconds >= self.stable_after:
            self.delay = self.backoff_initial

    def record_crash(self) -> bool:
        """Count one crash; True when that opened the breaker (no more restarts)."""
        opened = self.breaker.record()
        return self.opens and opened

    async def wait(self, until: anyio.Event | None = None) -> None:
        """Wait out the backoff (``until`` set ends it early: a stop), then double it."""
        if until is None:
            await anyio.sleep(self.delay)
        else:
            with anyio.move_on_after(self.delay):
                await until.wait()
        self.delay = min(self.delay * 2, self.backoff_max)


class Restartable(Protocol):
    """One run of a child, as :func:`supervise` drives it (``RpcWorker`` is one)."""

    @property
    def exited(self) -> anyio.Event: ...

    @property
    def returncode(self) -> int | None: ...

    async def start(self, tg: anyio.abc.TaskGroup) -> None:
        """Spawn (its tasks in ``tg``) and return once ready; raise StartFailed, child gone, else."""

    async def stop(self) -> int | None:
        """Stop and reap; idempotent."""

    def ready_words(self) -> str:
        """What the ``ready`` event says (``listening on 127.0.0.1:50052 (pid 123)``)."""


def exit_words(returncode: int | None) -> str:
    """A crash's words for an exit: ``exited with code 1``, ``exited killed by SIGKILL``."""
    how = describe_returncode(returncode)
    return how if how.startswith("exited") else f"exited {how}"


async def supervise(
    name: str,
    make: Callable[[], Restartable],
    policy: RestartPolicy,
    *,
    on_event: ChildEventFn | None = None,
    fatal_first: frozenset[str] = frozenset(),
) -> None:
    """Keep one child running until cancelled: start it (``make()`` gives a fresh run), wait for its
    end, restart after the policy's backoff. A first start that fails for a reason in
    ``fatal_first`` (waiting cannot fix it: the port is taken) raises it: there is nothing to
    supervise yet. An open breaker raises :class:`StartFailed` (reason ``crash_loop``).

    However it ends (cancelled while starting included) the child is stopped and reaped first.
    """
    emit = on_event or (lambda _n, _e, _d: None)
    ever_ready = False
    while True:
        failed: StartFailed | None = None
        child = make()
        async with anyio.create_task_group() as tg:
            try:
                try:
                    await child.start(tg)
                except StartFailed as exc:
                    failed = exc
                else:
                    ever_ready = True
                    started = time.monotonic()
                    emit(name, ChildEvent.READY, child.ready_words())
                    await child.exited.wait()
                    policy.ran_for(time.monotonic() - started)
            finally:
                with anyio.CancelScope(shield=True):
                    await child.stop()
                tg.cancel_scope.cancel()
        if failed is not None and not ever_ready and failed.reason in fatal_first:
            raise failed  # the caller's one error line says it
        last = failed.message if failed is not None else exit_words(child.returncode)
        emit(name, ChildEvent.CRASH, last)
        if policy.record_crash():
            crashes, window = policy.breaker.crashes, policy.breaker.window
            message = f"{name}: {crashes} crashes in {window:g} s; last: {last}"
            emit(name, ChildEvent.FAILED, message)
            raise StartFailed(
                message, hint="see its log, fix the cause and start it again", reason="crash_loop"
            )
        emit(name, ChildEvent.RESTART, f"restarting in {policy.delay:g} s")
        await policy.wait()
