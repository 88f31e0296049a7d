"""The one restart policy (backoff + crash breaker) and event vocabulary of every child forge keeps
running: a model's llama-server (``supervisor/_managed``) and a ``forge worker``'s rpc-servers
(:func:`supervise`) alike.

The policy is a value with a clock; :func:`restart_loop` is the one loop that drives it, for
every supervised child: plan a start, run the child to its end, count a crash, wait the backoff.
What differs lives in a :class:`Life`'s steps: a model's (``supervisor/_managed``: placement,
context restore, watchers between a crash and the next start) and a worker's rpc-server
(:func:`supervise`: a start, a wait for the exit).

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
from enum import Enum, StrEnum
from typing import Protocol, TypeVar

import anyio
import anyio.abc

from .._errors import StartFailed
from ._outcomes import describe_returncode

__all__ = [
    "Breaker",
    "ChildEvent",
    "ChildEventFn",
    "Life",
    "Outcome",
    "RestartPolicy",
    "Restartable",
    "exit_words",
    "restart_loop",
    "supervise",
]


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


class Outcome(Enum):
    """How one child's life ended: a requested stop; a crash (restart after the backoff); or
    failed for good (a start that waiting cannot fix)."""

    STOPPED, CRASHED, FAILED = range(3)


Plan = TypeVar("Plan")


class Life(Protocol[Plan]):
    """The steps of one supervised thing, as :func:`restart_loop` drives them."""

    @property
    def stop_event(self) -> anyio.Event:
        """Set by a stop: the backoff's wait ends early."""
        ...

    def stopping(self) -> bool:
        """A stop was asked: no further start."""
        ...

    async def prepare(self) -> Plan | None:
        """What the next start needs (placement, a fresh child); None: it cannot be made (the
        step said why), and the loop ends."""
        ...

    async def live(self, plan: Plan) -> Outcome:
        """One child, from spawn to exit."""
        ...

    def crash_loop(self, policy: RestartPolicy) -> None:
        """The crash just counted opened the breaker: no more restarts (say why, or raise)."""
        ...

    def restarting(self, delay: float) -> None:
        """A restart comes after ``delay`` seconds (say so)."""
        ...


async def restart_loop(life: Life[Plan], policy: RestartPolicy) -> None:
    """Start, run, restart with backoff until a stop, a failure, or an open breaker: the one
    restart loop of every child forge keeps running."""
    policy.rewind()
    while not life.stopping():
        plan = await life.prepare()
        if plan is None or life.stopping():
            return
        if await life.live(plan) is not Outcome.CRASHED or life.stopping():
            return
        if policy.record_crash():
            life.crash_loop(policy)
            return
        life.restarting(policy.delay)
        await policy.wait(life.stop_event)


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
    await restart_loop(_Supervised(name, make, policy, on_event, fatal_first), policy)


class _Supervised:
    """:func:`supervise`'s :class:`Life`: a child with nothing around it but its events."""

    def __init__(
        self,
        name: str,
        make: Callable[[], Restartable],
        policy: RestartPolicy,
        on_event: ChildEventFn | None,
        fatal_first: frozenset[str],
    ) -> None:
        self.name, self.make, self.policy, self.fatal_first = name, make, policy, fatal_first
        self.emit: ChildEventFn = on_event or (lambda _n, _e, _d: None)
        self.stop_event = anyio.Event()  # never set: it runs until cancelled
        self.ever_ready = False
        self.last = ""

    def stopping(self) -> bool:
        return False

    async def prepare(self) -> Restartable:
        return self.make()

    async def live(self, child: Restartable) -> Outcome:
        failed: StartFailed | None = None
        async with anyio.create_task_group() as tg:
            try:
                try:
                    await child.start(tg)
                except StartFailed as exc:
                    failed = exc
                else:
                    self.ever_ready = True
                    started = time.monotonic()
                    self.emit(self.name, ChildEvent.READY, child.ready_words())
                    await child.exited.wait()
                    self.policy.ran_for(time.monotonic() - started)
            finally:
                with anyio.CancelScope(shield=True):
                    await child.stop()
                tg.cancel_scope.cancel()
        if failed is not None and not self.ever_ready and failed.reason in self.fatal_first:
            raise failed  # the caller's one error line says it
        self.last = failed.message if failed is not None else exit_words(child.returncode)
        self.emit(self.name, ChildEvent.CRASH, self.last)
        return Outcome.CRASHED

    def crash_loop(self, policy: RestartPolicy) -> None:
        crashes, window = policy.breaker.crashes, policy.breaker.window
        message = f"{self.name}: {crashes} crashes in {window:g} s; last: {self.last}"
        self.emit(self.name, ChildEvent.FAILED, message)
        raise StartFailed(message, hint="see its log, fix the cause and start it again", reason="crash_loop")

    def restarting(self, delay: float) -> None:
        self.emit(self.name, ChildEvent.RESTART, f"restarting in {delay:g} s")
