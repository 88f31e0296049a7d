"""The one child lifecycle (``ChildProcess``) and restart policy (``RestartPolicy``, ``supervise``),
in milliseconds, against a FAKE generic server (``tests/support/fake_child.py``) and real signals:
readiness by each declared signal, classified exits, SIGKILL mid-run → restart with backoff, the
breaker after N quick crashes, the stop of a SIGSTOPped child that ignores SIGTERM, and a caller
cancelled during the start that leaves no child. The real llama-server and rpc-server go through
the same lifecycle in test_instance.py and test_rpc_worker.py."""

from __future__ import annotations

import functools
import os
import re
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import ClassVar

import anyio
import anyio.abc
import psutil
import pytest

from rocmforge_supervisor import StartFailed
from rocmforge_supervisor.process import ChildEvent, LogRing, RestartPolicy, free_port
from rocmforge_supervisor.process._child import ChildKind, ChildProcess, HttpOk, LogLine, OwnsChild, PortBound
from rocmforge_supervisor.process._restart import supervise
from rocmforge_supervisor.supervisor import ModelState
from rocmforge_supervisor.supervisor._events import EventKind
from tests.support.service import wait_for

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

FAKE = Path(__file__).parents[1] / "support" / "fake_child.py"


class _HttpKind(ChildKind):
    program = "fake-server"
    readiness: ClassVar[HttpOk | PortBound | LogLine] = HttpOk("/health")
    spawn_hint = "pass the fake's path"
    fail_fast = (("bind", re.compile(r"cannot bind"), "it could not bind"),)

    def classify(self, tail: list[str], returncode: int | None) -> str:
        return "bad_args" if any("bad flag" in line for line in tail) else "crashed"


class _PortKind(_HttpKind):
    readiness = PortBound()


class _LineKind(_HttpKind):
    readiness = LogLine(re.compile(r"^ready to serve$"))


class FakeServer(OwnsChild):
    """A fake server on the lifecycle, as a new kind's class would be (a Restartable)."""

    def __init__(
        self,
        log: LogRing,
        *args: str,
        kind: ChildKind | None = None,
        grace: float = 2.0,
        ready_timeout: float | None = 20.0,
        stall_timeout: float | None = None,
        binary: str = sys.executable,
    ) -> None:
        self.child = ChildProcess(kind or _HttpKind(), log, label="fake")
        self.args, self.grace, self.binary = args, grace, binary
        self.ready_timeout, self.stall_timeout = ready_timeout, stall_timeout

    async def start(self, tg: anyio.abc.TaskGroup) -> None:
        port = free_port()
        argv = [self.binary, str(FAKE), "--port", str(port), *self.args]
        await self.child.spawn(tg, argv, env=dict(os.environ), port=port)
        await self.child.wait_ready(ready_timeout=self.ready_timeout, stall_timeout=self.stall_timeout)

    async def stop(self) -> int | None:
        return await self.child.stop(self.grace)

    def ready_words(self) -> str:
        return f"pid {self.pid}"


def _dead(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE  # nobody will run it again
    except psutil.NoSuchProcess:
        return True


def _gone(pid: int, timeout: float = 10.0) -> bool:
    """The process is gone within ``timeout`` (raises when not)."""
    return bool(wait_for(lambda: _dead(pid), timeout=timeout, interval=0.01, what=f"pid {pid} gone"))


async def _until(cond: Callable[[], object], timeout: float = 20.0) -> None:
    with anyio.fail_after(timeout):
        while not cond():  # noqa: ASYNC110 — processes and psutil states: nothing to wait on
            await anyio.sleep(0.01)


@pytest.fixture
def ring(tmp_path: Path) -> Iterator[LogRing]:
    log = LogRing(tmp_path / "fake.log")
    yield log
    log.close()


async def _started(server: FakeServer, tg: anyio.abc.TaskGroup) -> int:
    await server.start(tg)
    assert server.pid is not None
    return server.pid


@pytest.mark.parametrize(
    ("kind", "args"),
    [
        (_HttpKind(), ["--http", "--delay", "0.2"]),
        (_PortKind(), ["--delay", "0.2"]),
        (_LineKind(), ["--say", "warming up", "--say", "ready to serve"]),
    ],
    ids=["http-200", "port-bound", "log-line"],
)
async def test_each_readiness_signal_means_ready_and_stop_reaps(
    ring: LogRing, kind: ChildKind, args: list[str]
) -> None:
    server = FakeServer(ring, *args, kind=kind)
    async with anyio.create_task_group() as tg:
        pid = await _started(server, tg)
        assert server.state == "ready" and server.alive
        assert psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        assert await server.stop() == 0  # its SIGTERM handler ran
        tg.cancel_scope.cancel()
    assert server.state == "exited" and _gone(pid)
    assert f"fake-server pid {pid} exited with code 0 (while stopping)" in "\n".join(ring.tail(5))


async def test_an_answerless_port_is_not_http_ready(ring: LogRing) -> None:
    """A bound port without HTTP is not ready for an HttpOk kind: the start times out, child gone."""
    server = FakeServer(ring, kind=_HttpKind(), ready_timeout=0.5)
    async with anyio.create_task_group() as tg:
        with pytest.raises(StartFailed) as err:
            await server.start(tg)
        tg.cancel_scope.cancel()
    assert err.value.reason == "timeout" and "not ready after 0.5 s" in err.value.message
    assert server.pid is not None and _gone(server.pid)


async def test_start_failures_are_classified_by_the_kind(tmp_path: Path) -> None:
    def ring(i: int) -> LogRing:
        return LogRing(tmp_path / f"fake-{i}.log")  # its own log each: classification reads the tail

    cases: list[tuple[FakeServer, str, str]] = [
        (
            FakeServer(ring(0), "--say", "bad flag --frob", "--fail-start", "2"),
            "bad_args",
            "exited with code 2",
        ),
        (FakeServer(ring(1), "--fail-start", "3"), "crashed", "exited with code 3"),
        (FakeServer(ring(2), "--no-bind", "--say", "cannot bind 1.2.3.4"), "bind", "it could not bind"),
        (FakeServer(ring(3), "--no-bind", stall_timeout=0.3), "timeout", "no output for 0.3 s while loading"),
    ]
    for server, reason, words in cases:
        async with anyio.create_task_group() as tg:
            with pytest.raises(StartFailed) as err:
                await server.start(tg)
            tg.cancel_scope.cancel()
        assert err.value.reason == reason, err.value
        assert err.value.message == f"fake-server failed to start: {words}"
        assert server.pid is not None and _gone(server.pid)  # a fail-fast line stopped a live child
        if reason == "bad_args":
            assert "bad flag --frob" in err.value.stderr_tail  # what the kind classified it by
        server.child.log.close()


async def test_a_missing_binary_fails_the_start_and_says_which(ring: LogRing, tmp_path: Path) -> None:
    """The parent-death wrapper (setpriv, or the shim) is what starts; it then fails to exec."""
    server = FakeServer(ring, binary=str(tmp_path / "no-such-server"))
    async with anyio.create_task_group() as tg:
        with pytest.raises(StartFailed) as err:
            await server.start(tg)
    assert err.value.reason == "crashed" and err.value.returncode not in (None, 0)
    assert "no-such-server" in "\n".join(err.value.stderr_tail)


async def test_sigkill_mid_run_is_a_classified_crash_then_a_restart_with_backoff(ring: LogRing) -> None:
    events: list[tuple[float, ChildEvent, str]] = []
    made: list[FakeServer] = []
    policy = RestartPolicy(backoff_initial=0.2, backoff_max=5.0, crash_loop_max=None, crash_loop_window=60)

    def make() -> FakeServer:
        made.append(FakeServer(ring, "--http"))
        return made[-1]

    def readies() -> int:
        return sum(1 for _t, e, _d in events if e == ChildEvent.READY)

    def note(_name: str, event: ChildEvent, detail: str) -> None:
        events.append((time.monotonic(), event, detail))

    async with anyio.create_task_group() as tg:
        tg.start_soon(functools.partial(supervise, "fake", make, policy, on_event=note))
        await _until(lambda: readies() == 1)
        for n in (2, 3):
            pid = made[-1].pid
            assert pid is not None
            os.kill(pid, signal.SIGKILL)  # mid-run, not through us
            await _until(functools.partial(lambda k: readies() == k, n))
        tg.cancel_scope.cancel()
    kinds = [e for _t, e, _d in events]
    R, C, S = ChildEvent.READY, ChildEvent.CRASH, ChildEvent.RESTART
    assert kinds == [R, C, S, R, C, S, R]
    words = [d for _t, e, d in events if e != R]
    assert words == [
        "exited killed by SIGKILL",
        "restarting in 0.2 s",
        "exited killed by SIGKILL",
        "restarting in 0.4 s",  # doubled: it had not run stable_after seconds
    ]
    # The backoff was waited out: each next ready came at least that long after its restart event.
    restarts = [t for t, e, _d in events if e == S]
    later_readies = [t for t, e, _d in events if e == R][1:]
    assert later_readies[0] - restarts[0] >= 0.2 and later_readies[1] - restarts[1] >= 0.4
    assert all(s.pid is not None and _gone(s.pid) for s in made)  # the last one stopped at the cancel
    log = "\n".join(ring.tail(60))
    assert f"fake-server pid {made[0].pid} killed by SIGKILL (while ready)" in log


async def test_the_breaker_opens_after_n_quick_crashes(ring: LogRing) -> None:
    events: list[tuple[ChildEvent, str]] = []
    made: list[FakeServer] = []
    policy = RestartPolicy(backoff_initial=0.01, backoff_max=0.05, crash_loop_max=3, crash_loop_window=60)

    def make() -> FakeServer:
        made.append(FakeServer(ring, "--http", "--exit-after", "0.1", "--code", "3"))
        return made[-1]

    with pytest.raises(StartFailed) as err:
        await supervise("fake", make, policy, on_event=lambda _n, e, d: events.append((e, d)))
    assert err.value.reason == "crash_loop"
    assert err.value.message == "fake: 3 crashes in 60 s; last: exited with code 3"
    assert [e for e, _d in events] == [
        *[ChildEvent.READY, ChildEvent.CRASH, ChildEvent.RESTART] * 2,
        ChildEvent.READY,
        ChildEvent.CRASH,
        ChildEvent.FAILED,
    ]
    assert len(made) == 3 and all(s.pid is not None and _gone(s.pid) for s in made)


async def test_a_first_start_waiting_cannot_fix_is_raised_not_retried(ring: LogRing) -> None:
    made: list[FakeServer] = []

    def make() -> FakeServer:
        made.append(FakeServer(ring, "--say", "bad flag", "--fail-start", "2"))
        return made[-1]

    policy = RestartPolicy(backoff_initial=0.01, backoff_max=0.05, crash_loop_max=None, crash_loop_window=60)
    with pytest.raises(StartFailed) as err:
        await supervise("fake", make, policy, fatal_first=frozenset({"bad_args"}))
    assert err.value.reason == "bad_args" and len(made) == 1


@pytest.mark.parametrize("ignore_term", [True, False], ids=["ignores-sigterm", "honours-sigterm"])
async def test_stop_of_a_sigstopped_child(ring: LogRing, ignore_term: bool) -> None:
    """SIGSTOPped (a hang): the stop sends SIGCONT with its SIGTERM, so a child that honours it
    exits at once; one that ignores it gets SIGKILL after the bounded wait, and so does what it
    forked into its group."""
    args = ["--http", "--fork", *(["--ignore-term"] if ignore_term else [])]
    server = FakeServer(ring, *args, grace=0.5)
    async with anyio.create_task_group() as tg:
        pid = await _started(server, tg)
        [grandchild] = psutil.Process(pid).children()
        os.kill(pid, signal.SIGSTOP)
        await _until(lambda: psutil.Process(pid).status() == psutil.STATUS_STOPPED)
        began = time.monotonic()
        rc = await server.stop()
        took = time.monotonic() - began
        tg.cancel_scope.cancel()
    assert _gone(pid) and _gone(grandchild.pid)
    if ignore_term:
        assert rc == -signal.SIGKILL and 0.5 <= took < 10
        assert "no exit 0.5 s after SIGTERM: sending SIGKILL" in "\n".join(ring.tail(5))
    else:
        assert rc == 0 and took < 0.5  # its handler ran: SIGCONT let it


@pytest.mark.parametrize("ignore_term", [False, True], ids=["honours-sigterm", "ignores-sigterm"])
async def test_a_caller_cancelled_during_the_start_leaves_no_child(ring: LogRing, ignore_term: bool) -> None:
    """Cancelled while the child loads (never ready): the shielded stop still runs to the end,
    SIGKILL included when SIGTERM is ignored, before the cancellation goes on."""
    made: list[FakeServer] = []

    def make() -> FakeServer:
        made.append(FakeServer(ring, "--no-bind", *(["--ignore-term"] if ignore_term else []), grace=0.3))
        return made[-1]

    policy = RestartPolicy(backoff_initial=0.01, backoff_max=0.05, crash_loop_max=None, crash_loop_window=60)
    with anyio.CancelScope() as scope:
        async with anyio.create_task_group() as tg:
            tg.start_soon(supervise, "fake", make, policy)
            # Running its own code (SIGTERM ignored by now), loading: never to be ready.
            await _until(lambda: made and f"fake child pid {made[-1].pid} starting" in ring.tail(5))
            scope.cancel()
    assert scope.cancelled_caught
    [server] = made
    assert server.pid is not None
    assert server.returncode == (-signal.SIGKILL if ignore_term else 0)  # reaped by us
    assert _gone(server.pid, timeout=0.5)


def test_the_restart_policy_backs_off_resets_and_breaks() -> None:
    now = [0.0]
    policy = RestartPolicy(
        backoff_initial=1.0, backoff_max=4.0, crash_loop_max=3, crash_loop_window=10.0, clock=lambda: now[0]
    )
    delays = []
    for _ in range(4):
        delays.append(policy.delay)
        policy.delay = min(policy.delay * 2, policy.backoff_max)  # what wait() does after its sleep
    assert delays == [1.0, 2.0, 4.0, 4.0]
    policy.ran_for(3.9)
    assert policy.delay == 4.0  # not stable yet: stable_after defaults to backoff_max
    policy.ran_for(4.0)
    assert policy.delay == 1.0
    assert [policy.record_crash() for _ in range(3)] == [False, False, True]
    now[0] = 100.0
    assert not policy.record_crash()  # the old ones left the window
    never = RestartPolicy(backoff_initial=1.0, backoff_max=4.0, crash_loop_max=None, crash_loop_window=10.0)
    assert not any(never.record_crash() for _ in range(50))


def test_one_event_vocabulary_for_the_supervisor_and_forge_worker() -> None:
    assert EventKind.CRASH.value == ChildEvent.CRASH.value == "crash"
    assert EventKind.RESTART.value == ChildEvent.RESTART.value == "restart"
    assert ModelState.READY.value == ChildEvent.READY.value
    assert ModelState.FAILED.value == ChildEvent.FAILED.value
