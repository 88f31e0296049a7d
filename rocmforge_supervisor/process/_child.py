"""A server process forge owns: the one lifecycle every kind of child goes through.

:class:`ChildProcess` is the process part, the same for every server forge runs: spawn it in its
own process group with the parent-death signal (``with_parent_death``), drain its output into a
:class:`LogRing` from the first byte, notice its exit at once (a task waits on it), wait for a
declared readiness signal, stop it (SIGTERM to the group, said twice, bounded wait, SIGKILL; shielded
from cancellation, as anyio's ``Process.aclose`` is) and say how it ended. Only this module (and
the stale sweep in ``_ledger``, the build's group in ``_groups``) sends signals.

What differs between servers is a :class:`ChildKind`, a small *description*: the program's name,
its :data:`Readiness` (:class:`HttpOk`, :class:`PortBound` or :class:`LogLine`), the log lines
that end a start at once, how a failed start reads, and what a crash means (its advice). ``LlamaServerKind`` (``_instance``) and
``RpcServerKind`` (``_rpc_worker``) are the two there are.

How to add a kind of server (whisper.cpp's ``whisper-server``, say):

1. A ``ChildKind`` subclass: ``program = "whisper-server"``; ``readiness = HttpOk("/health")``
   (it loads the model before it binds, so its first 200 is ready); ``spawn_hint`` (how to get
   the binary); ``fail_fast`` for log lines that mean the start failed before it exits; override
   :meth:`ChildKind.classify` / :meth:`ChildKind.failure` to name its failures and what to do,
   :meth:`ChildKind.crash_cause` for what a later crash means.
2. A thin class on :class:`OwnsChild` (which shows ``pid``, ``exited``, ``returncode``… of its
   ``child = ChildProcess(kind, log, label=…, host=…)``): it builds the argv and the environment
   (``clean_child_env``), calls :meth:`ChildProcess.spawn` then :meth:`ChildProcess.wait_ready`,
   and stops it in a ``finally`` (``RpcWorker`` is ~30 lines; the tests' ``FakeServer`` too).
   What the server serves (``/props``, ``/slots``, one request at a time) belongs there or above,
   not here.
3. Restarts: the supervisor's model loop (``RestartPolicy``) or :func:`._restart.supervise`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

import anyio
import anyio.abc
import httpx
import psutil

from .._errors import StartFailed
from ..client import socket_gone_as_httpx_error
from ._logs import LogRing, line_blocks_of
from ._outcomes import InstanceState, describe_returncode
from ._spawn import with_parent_death

__all__ = ["ChildKind", "ChildProcess", "HttpOk", "LogLine", "OwnsChild", "PortBound", "Readiness"]

log = logging.getLogger("rocmforge.process")

#: Readiness polls: the first within a few ms, then doubling, capped.
_POLL_FIRST, _POLL_MAX = 0.002, 0.05


@dataclass(frozen=True)
class HttpOk:
    """Ready when ``GET path`` on the child's port answers 200 (another answer: alive, loading).
    ``hurry``: a log line after which to ask at once rather than at the next poll."""

    path: str = "/health"
    hurry: re.Pattern[str] | None = None


@dataclass(frozen=True)
class PortBound:
    """Ready when the child itself holds a listening TCP socket on its port, read from /proc.

    Not a connect: something else may hold the port (the connect succeeds while the child fails
    to bind), and a connect costs a one-client server an accept.
    """


@dataclass(frozen=True)
class LogLine:
    """Ready when the child prints a line matching ``pattern``."""

    pattern: re.Pattern[str]


Readiness = HttpOk | PortBound | LogLine


class ChildKind:
    """What one kind of server is, to :class:`ChildProcess` (see the module docstring)."""

    #: Its name in log notes and messages (``llama-server``).
    program: ClassVar[str] = "server"
    readiness: ClassVar[Readiness] = HttpOk()
    #: The hint when its binary cannot be executed.
    spawn_hint: ClassVar[str] = "check the server binary"
    #: (reason, log line pattern, message): a line that means the start failed, before any exit.
    fail_fast: ClassVar[Sequence[tuple[str, re.Pattern[str], str]]] = ()
    #: Its log is on stdout (stderr joins it; line-buffered through ``stdbuf``), not on stderr.
    log_on_stdout: ClassVar[bool] = False

    def classify(self, tail: list[str], returncode: int | None) -> str:
        """Why a start ended in an exit, as a :data:`START_HINTS` reason, from its last lines."""
        return "crashed"

    def failure(self, reason: str, message: str, child: ChildProcess) -> StartFailed:
        """The error a failed start raises (``message``: what the lifecycle saw)."""
        return StartFailed(
            f"{self.program} failed to start: {message}",
            hint="see its log",
            reason=reason,
            returncode=child.returncode,
            stderr_tail=child.log.tail(15),
        )

    def crash_cause(
        self, tail: list[str], returncode: int | None, *, computed: bool, amx: bool
    ) -> str | None:
        """What an exit after ready means and what to do, from its last lines and its status
        (``computed``: it had finished a computation; ``amx``: this CPU has Intel AMX, which ggml
        servers at the pin fault on). None: its exit status says it all."""
        return None

    def on_line(self, line: str, child: ChildProcess) -> None:
        """Each line of its log, after the lifecycle read it (``LlamaServerKind`` marks its first
        computation)."""


class ChildProcess:
    """One process of a :class:`ChildKind`: spawn, readiness, stop (see the module docstring).

    Reusable after an exit through :meth:`reset` (a start retried on another port).
    """

    def __init__(
        self,
        kind: ChildKind,
        log_ring: LogRing,
        *,
        label: str,
        host: str = "127.0.0.1",
        readiness: Readiness | None = None,
    ) -> None:
        self.kind = kind
        #: What says it is ready: the kind's, unless this child's program names its own (a user's
        #: command: its ``health`` path or ``ready_log`` line).
        self.readiness: Readiness = readiness if readiness is not None else kind.readiness
        self.log = log_ring
        self.label = label  # the model alias, the worker name: for the supervisor's log
        self.host = host
        self.state: InstanceState = "new"
        self.port: int | None = None
        self.pid: int | None = None
        self.returncode: int | None = None
        self.exited = anyio.Event()
        #: Signs read from its log: "listening" (readiness's hurry line), fail_fast reasons, the
        #: kind's own.
        self.flags: set[str] = set()
        self.killed = False  # kill() was sent: dying, no longer to be given requests
        self.listening_at: float | None = None  # monotonic time the hurry line was read
        self.last_output = time.monotonic()
        self.stop_requested = False
        #: It exited (or was killed) before anyone asked it to stop.
        self.died_unasked = False
        #: Lines the current spawn printed: none, for a llama-server that exited before its
        #: logging thread wrote anything (seen under CPU load on a port taken or a missing file).
        self.lines_read = 0
        self._process: anyio.abc.Process | None = None
        self._wake = anyio.Event()
        self._drain_done = anyio.Event()
        self._stop_lock = anyio.Lock()

    @property
    def base_url(self) -> str:
        if self.port is None:
            raise RuntimeError("not started")
        return f"http://{self.host}:{self.port}"

    @property
    def alive(self) -> bool:
        return self._process is not None and not self.exited.is_set()

    @property
    def serving(self) -> bool:
        """Alive and not being killed: a child :meth:`kill` was sent to stays alive until its exit
        is noticed, but no new request may go to it (it would find the port closed)."""
        return self.alive and not self.killed

    def reset(self) -> None:
        """After an exit: ready for another :meth:`spawn` (a start retried on another port)."""
        self._process = None
        self.exited = anyio.Event()
        self.killed = False
        self.flags.clear()
        self.returncode = None

    async def spawn(
        self,
        tg: anyio.abc.TaskGroup,
        argv: list[str],
        *,
        env: Mapping[str, str],
        port: int,
        shown: Sequence[str] | None = None,
    ) -> None:
        """Start ``argv`` (its drain and exit watch run in ``tg``). ``shown``: the command line as
        the log says it (secrets redacted), when not ``argv``."""
        self.port = port
        self.log.note("starting: " + " ".join(argv if shown is None else shown))
        cmd = argv
        if self.kind.log_on_stdout:
            stdbuf = shutil.which("stdbuf")  # printf to a pipe is block-buffered: line-buffer it
            cmd = [stdbuf, "-oL", *argv] if stdbuf else argv
        try:
            # Shielded: a cancellation inside asyncio's subprocess creation kills the new child
            # but leaves it unreaped (a ResourceWarning, a zombie); once it exists, the caller's
            # cleanup stops and reaps it like any other.
            with anyio.CancelScope(shield=True):
                process = await anyio.open_process(
                    with_parent_death(cmd),
                    stdin=None,
                    stdout=subprocess.PIPE if self.kind.log_on_stdout else subprocess.DEVNULL,
                    stderr=subprocess.STDOUT if self.kind.log_on_stdout else subprocess.PIPE,
                    env=env,
                    start_new_session=True,
                )
        except OSError as exc:
            raise StartFailed(
                f"could not start {argv[0]}: {exc.strerror or exc}",
                hint=self.kind.spawn_hint,
                reason="crashed",
            ) from exc
        self._process = process
        self.pid = process.pid
        self._drain_done = anyio.Event()
        self.lines_read = 0  # this spawn's own lines (a child that dies fast may print none)
        self.last_output = time.monotonic()
        self.state = "loading"
        stream = process.stdout if self.kind.log_on_stdout else process.stderr
        assert stream is not None
        tg.start_soon(self._drain, stream)
        tg.start_soon(self._watch_exit, process)

    async def wait_ready(self, *, ready_timeout: float | None, stall_timeout: float | None = None) -> None:
        """Until the kind's readiness signal; else the child is stopped and the kind's
        :class:`StartFailed` raised: it exited, a ``fail_fast`` line, no output for
        ``stall_timeout``, not ready after ``ready_timeout``, or :meth:`stop` asked meanwhile."""
        readiness = self.readiness
        started = time.monotonic()
        delay = _POLL_FIRST
        async with contextlib.AsyncExitStack() as stack:
            client: httpx.AsyncClient | None = None
            if isinstance(readiness, HttpOk):
                # verify=False: plain http on loopback; a default client loads the CA bundle.
                client = await stack.enter_async_context(
                    httpx.AsyncClient(
                        base_url=self.base_url,
                        timeout=httpx.Timeout(2.0, connect=0.5),
                        trust_env=False,
                        verify=False,
                    )
                )
            while True:
                if self.stop_requested:
                    await self.stop(2.0)
                    raise self.kind.failure("cancelled", "stopped while loading", self)
                if self.exited.is_set():
                    await self.drained()
                    reason = self.kind.classify(self.log.tail(40), self.returncode)
                    raise self.kind.failure(reason, describe_returncode(self.returncode), self)
                for reason, _pattern, message in self.kind.fail_fast:
                    if reason in self.flags:
                        await self.stop(2.0)
                        raise self.kind.failure(reason, message, self)
                now = time.monotonic()
                if stall_timeout is not None and now - self.last_output > stall_timeout:
                    await self.stop(2.0)
                    raise self.kind.failure(
                        "timeout", f"no output for {stall_timeout:g} s while loading", self
                    )
                if ready_timeout is not None and now - started > ready_timeout:
                    await self.stop(2.0)
                    raise self.kind.failure("timeout", f"not ready after {ready_timeout:g} s", self)
                if await self._probe(readiness, client):
                    self.state = "ready"
                    return
                self._wake = anyio.Event()
                if "listening" in self.flags:
                    delay = 0.0  # the log says ready: confirm right away
                with anyio.move_on_after(delay):
                    await self._wake.wait()
                delay = min(max(delay * 2, _POLL_FIRST), _POLL_MAX)

    async def stop(self, grace: float) -> int | None:
        """SIGTERM to its group (said again after up to 1 s), ``grace`` seconds, then SIGKILL.
        Idempotent; shielded from cancellation, so a cancelled caller still leaves no child.
        Returns the exit status (negative: the signal), None when even SIGKILL did not reap it
        within 30 s.

        Waits on the process itself, not on the watcher task, so it works from a cancelled
        context too (the watcher may already be gone).
        """
        self.stop_requested = True
        self._wake.set()  # a start in progress sees the request at once (see wait_ready)
        with anyio.CancelScope(shield=True):
            returncode = await self._stop(grace)
        return returncode

    async def _stop(self, grace: float) -> int | None:
        async with self._stop_lock:
            proc = self._process
            if proc is None:
                return self.returncode
            if proc.returncode is None:
                self.state = "stopping"
                self.signal_group(signal.SIGTERM)
                self.signal_group(signal.SIGCONT)  # a stopped (SIGSTOP) child must run to see it
                first = min(1.0, grace / 2)
                with anyio.move_on_after(first):
                    await proc.wait()
                if proc.returncode is None:
                    # llama-server can lose a SIGTERM that lands between `listening on` and the
                    # start of its main loop (server-queue.cpp sets running=true after the handler
                    # cleared it): say it once more before the grace period runs out.
                    self.signal_group(signal.SIGTERM)
                    with anyio.move_on_after(grace - first):
                        await proc.wait()
                if proc.returncode is None:
                    self.log.note(f"no exit {grace:g} s after SIGTERM: sending SIGKILL")
                    self.signal_group(signal.SIGKILL)
                    with anyio.move_on_after(30):
                        await proc.wait()
                    if proc.returncode is None:
                        # Stuck in the kernel (D state: a GPU driver hang). Waiting longer would
                        # hang the caller; the kill is queued and the kernel will deliver it.
                        self.log.note("still not reaped 30 s after SIGKILL: giving up waiting")
                        return None
            self._mark_exited(proc)
            return self.returncode

    def kill(self, reason: str) -> None:
        """SIGKILL the whole group now, and say why in its log: for a child that no longer answers
        (:meth:`stop` would wait out its grace first). The caller decides *that* it must die."""
        if self._process is None or self.exited.is_set():
            return
        self.killed = True
        self.log.note(f"killing pid {self._process.pid} (SIGKILL): {reason}")
        log.warning("%s %s pid %d: SIGKILL: %s", self.kind.program, self.label, self._process.pid, reason)
        self.signal_group(signal.SIGCONT)
        self.signal_group(signal.SIGKILL)

    def signal_group(self, sig: int) -> None:
        if self._process is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._process.pid, sig)

    def note_unasked_death(self) -> None:
        """Before our own stop: has the child died already (exited, or a zombie whose exit the
        watcher has not read yet)?"""
        if self.stop_requested or self._process is None:
            return
        if self.exited.is_set():
            self.died_unasked = True
            return
        try:
            self.died_unasked = psutil.Process(self._process.pid).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            self.died_unasked = True
        except psutil.Error:
            pass

    async def drained(self) -> None:
        """After an exit: until the drain task has read the pipe to its end (at most 0.5 s: a
        grandchild outside the group may hold it open), so the last lines are in the log.

        Not "until no line came for a moment": on a busy machine the drain task can be that late,
        and a start failure read from a log without its last lines is misclassified.
        """
        with anyio.move_on_after(0.5):
            await self._drain_done.wait()

    # -- internals ----------------------------------------------------------------------------

    async def _probe(self, readiness: Readiness, client: httpx.AsyncClient | None) -> bool:
        if isinstance(readiness, HttpOk):
            assert client is not None
            try:
                with socket_gone_as_httpx_error(self.base_url):
                    r = await client.get(readiness.path)
            except httpx.HTTPError:
                return False
            return r.status_code == 200
        if isinstance(readiness, PortBound):
            return self.pid is not None and self.port is not None and _listens(self.pid, self.port)
        return "ready_line" in self.flags

    async def _drain(self, stream: anyio.abc.ByteReceiveStream) -> None:
        def seen() -> None:
            self.last_output = time.monotonic()

        try:
            async for lines in line_blocks_of(stream, on_chunk=seen):
                self._on_lines(lines)
        finally:
            self._drain_done.set()

    def _on_lines(self, lines: list[str]) -> None:
        """A read's lines: logged together; the start's signs (readiness, ``fail_fast``) are
        looked for only until it is ready (:meth:`wait_ready` is their only reader), so a serving
        child's chatter costs a write and the kind's own look (see ``line_blocks_of``)."""
        self.log.add_lines(lines)
        self.lines_read += len(lines)
        starting = self.state != "ready"
        for line in lines:
            if starting:
                self._start_signs(line)
            self.kind.on_line(line, self)

    def _start_signs(self, line: str) -> None:
        readiness = self.readiness
        if isinstance(readiness, HttpOk) and readiness.hurry is not None and readiness.hurry.search(line):
            self.listening_at = time.monotonic()
            self.flags.add("listening")
            self._wake.set()
        elif isinstance(readiness, LogLine) and readiness.pattern.search(line):
            self.flags.add("ready_line")
            self._wake.set()
        else:
            for reason, pattern, _message in self.kind.fail_fast:
                if pattern.search(line):
                    self.flags.add(reason)
                    self._wake.set()
                    break

    async def _watch_exit(self, proc: anyio.abc.Process) -> None:
        await proc.wait()
        self._mark_exited(proc)

    def _mark_exited(self, proc: anyio.abc.Process) -> None:
        if self.exited.is_set() or proc.returncode is None:
            return
        if not self.stop_requested:
            self.died_unasked = True
        self.returncode = proc.returncode
        # Anything the child forked into its group goes too — once, here, right after the exit
        # was seen: later the group id could belong to someone else.
        self.signal_group(signal.SIGKILL)
        was = self.state
        self.state = "exited"
        self.log.note(
            f"{self.kind.program} pid {proc.pid} {describe_returncode(self.returncode)} (while {was})"
        )
        self.exited.set()
        self._wake.set()


class OwnsChild:
    """What a server class built on one :class:`ChildProcess` shows of it (``ModelServer`` and
    ``RpcWorker`` are; a new kind's class is too)."""

    child: ChildProcess

    @property
    def state(self) -> InstanceState:
        return self.child.state

    @property
    def port(self) -> int | None:
        return self.child.port

    @property
    def pid(self) -> int | None:
        return self.child.pid

    @property
    def returncode(self) -> int | None:
        return self.child.returncode

    @property
    def exited(self) -> anyio.Event:
        """Set when the child has exited (noticed at once: a task waits on the process)."""
        return self.child.exited

    @property
    def alive(self) -> bool:
        return self.child.alive

    @property
    def serving(self) -> bool:
        return self.child.serving

    @property
    def stop_requested(self) -> bool:
        return self.child.stop_requested

    @property
    def died_unasked(self) -> bool:
        """The child exited (or was killed) before anyone asked it to stop: whatever else went
        wrong around it, its exit is the cause to report."""
        return self.child.died_unasked


def _listens(pid: int, port: int) -> bool:
    """Whether process ``pid`` itself has a listening TCP socket on ``port``."""
    try:
        conns = psutil.Process(pid).net_connections(kind="tcp")
    except psutil.Error:
        return False
    return any(c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port for c in conns)
