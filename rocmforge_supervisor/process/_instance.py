"""One llama-server child: spawn, drain, watch, know when it is ready or why not, stop.

Only ``process/`` signals a child (here; the stale sweep in ``_ledger``). Its life is an async context::

    async with LlamaServer(spec) as server:     # spawned and ready (or StartFailed, child gone)
        ...server.base_url, server.api_key...
        await server.exited.wait()              # noticed at once: a task waits on the process
    # stopped: SIGTERM to its group, bounded wait, SIGKILL; reaped — even if the caller was cancelled

Alive and ready are different things: the child binds its port before it loads the model and
answers 503 until then. Readiness is whichever comes first of the ``listening on`` log line and a
200 from ``/health``; a 503 only proves it is alive.

No orphans: each child runs in its own process group (so a stop reaches anything it forks) and
gets ``PR_SET_PDEATHSIG=SIGKILL`` (through ``setpriv``, or a tiny exec shim), so it dies with the
supervisor even when the supervisor is SIGKILLed and no cleanup runs.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import anyio
import anyio.abc
import httpx
import psutil

from .._argv import redact
from .._errors import InstanceError, StartFailed, UsageError
from ..client import socket_gone_as_httpx_error
from ._env import clean_child_env
from ._logs import BIND_FAILED_RE, LISTENING_RE, OOM_PATTERNS, LogRing, classify_failure, lines_of
from ._ports import free_port, port_is_free
from ._spawn import with_parent_death
from ._spec import START_HINTS, InstanceSpec, InstanceState, describe_returncode, unwrap_group

log = logging.getLogger("rocmforge.process")

__all__ = ["LlamaServer"]

#: A finished request's timing line (``slot print_timing: … prompt eval time``): it computed.
_COMPUTED_RE = re.compile(r"print_timing|prompt eval time")


class LlamaServer:
    """One running llama-server. Use as ``async with``; see the module docstring."""

    def __init__(self, spec: InstanceSpec) -> None:
        self.spec = spec
        self.state: InstanceState = "new"
        self.port: int | None = None
        self.pid: int | None = None
        self.returncode: int | None = None
        self.api_key = spec.api_key if spec.api_key is not None else secrets.token_urlsafe(24)
        self.log = LogRing(spec.log_path)
        for listener in spec.line_listeners:
            self.log.subscribe(listener)
        self.exited = anyio.Event()
        self.started_at: float | None = None  # time.time()
        self.ready_at: float | None = None
        self.listening_at: float | None = None  # monotonic time the `listening on` line was read
        self.ready_monotonic: float | None = None
        self.load_seconds: float | None = None
        self._process: anyio.abc.Process | None = None
        self._tg: anyio.abc.TaskGroup | None = None
        self._own_tg: anyio.abc.TaskGroup | None = None
        self._last_output = time.monotonic()
        self._wake = anyio.Event()
        self._flags: set[str] = set()
        self._key_file: Path | None = None
        self._tmp_state: Path | None = None  # only when the caller gave no state_dir
        self._stop_lock = anyio.Lock()
        self.stop_requested = False
        #: The child exited (or was killed) before anyone asked it to stop: whatever else went
        #: wrong around it, its exit is the cause to report.
        self.died_unasked = False

    # -- public -------------------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        if self.port is None:
            raise RuntimeError("not started")
        return f"http://{self.spec.host}:{self.port}"

    @property
    def alive(self) -> bool:
        return self._process is not None and not self.exited.is_set()

    async def __aenter__(self) -> LlamaServer:
        self._own_tg = anyio.create_task_group()
        await self._own_tg.__aenter__()
        try:
            await self._own_tg.start(self.run)
        except BaseException as exc:
            self._own_tg.cancel_scope.cancel()
            # Re-raise the start error itself, not the task group's wrapper around it.
            with contextlib.suppress(BaseException):
                await self._own_tg.__aexit__(type(exc), exc, exc.__traceback__)
            self._own_tg = None
            raise unwrap_group(exc) from None
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stop the child and wait for :meth:`run` to finish. Shielded against cancellation."""
        with anyio.CancelScope(shield=True):
            await self.stop()
        if self._own_tg is not None:
            # Outside the shield (cancel scopes must nest); run() has its own shielded cleanup.
            tg, self._own_tg = self._own_tg, None
            await tg.__aexit__(None, None, None)

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[LlamaServer] = anyio.TASK_STATUS_IGNORED
    ) -> int | None:
        """The child's whole life, in one task: spawn, wait ready (``task_status.started``), wait
        for the exit. However it ends (stop(), crash, cancellation, start failure) the child is
        stopped and reaped before this returns; the return value is its exit status."""
        if self.state != "new":
            raise RuntimeError("a LlamaServer runs once")
        self.state = "starting"
        self.started_at = time.time()
        started = time.monotonic()
        attempts = 1 if self.spec.port is not None else max(1, self.spec.bind_retries)
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                try:
                    for attempt in range(attempts):
                        if self.stop_requested:  # stop() came before the spawn: never start it
                            raise self._fail("cancelled", "stopped before it started")
                        port = self.spec.port if self.spec.port is not None else free_port(self.spec.host)
                        if self.spec.port is not None and not port_is_free(port, self.spec.host):
                            raise UsageError(
                                f"port {port} on {self.spec.host} is already in use",
                                hint="choose another --port, or leave it unset to pick a free one",
                            )
                        try:
                            await self._spawn_and_wait(port)
                            break
                        except StartFailed as exc:
                            if exc.reason != "bind" or attempt == attempts - 1:
                                raise
                            self.log.note(f"port {port} was taken before the child bound it; retrying")
                            self._reset_for_retry()
                    self.load_seconds = time.monotonic() - started
                    task_status.started(self)
                    await self.exited.wait()
                finally:
                    self._note_unasked_death()
                    with anyio.CancelScope(shield=True):
                        await self.stop()
                    tg.cancel_scope.cancel()
        except BaseExceptionGroup as group:
            inner = unwrap_group(group)
            if inner is group:
                raise
            raise inner from None  # callers see the StartFailed itself, not a group of one
        finally:
            self._tg = None
            self.log.close()
            self._remove_key_file()
            if self._tmp_state is not None:
                shutil.rmtree(self._tmp_state, ignore_errors=True)
                self._tmp_state = None
        return self.returncode

    async def stop(self, timeout: float | None = None) -> int | None:
        """Idempotent. Returns the exit status (negative: the signal that ended it).

        Waits on the process itself, not on the watcher task, so it works from a cancelled
        context too (the watcher may already be gone).
        """
        self.stop_requested = True
        self._wake.set()  # a load in progress sees the request at once (see _wait_ready)
        async with self._stop_lock:
            proc = self._process
            if proc is None:
                return self.returncode
            if proc.returncode is None:
                self.state = "stopping"
                grace = self.spec.stop_timeout if timeout is None else timeout
                self._signal_group(signal.SIGTERM)
                self._signal_group(signal.SIGCONT)  # a stopped (SIGSTOP) child must run to see it
                first = min(1.0, grace / 2)
                with anyio.move_on_after(first):
                    await proc.wait()
                if proc.returncode is None:
                    # llama-server can lose a SIGTERM that lands between `listening on` and the
                    # start of its main loop (server-queue.cpp sets running=true after the handler
                    # cleared it): say it once more before the grace period runs out.
                    self._signal_group(signal.SIGTERM)
                    with anyio.move_on_after(grace - first):
                        await proc.wait()
                if proc.returncode is None:
                    self.log.note(f"no exit {grace:g} s after SIGTERM: sending SIGKILL")
                    self._signal_group(signal.SIGKILL)
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
        """SIGKILL the child's whole process group now, and say why in its log.

        For a child that no longer answers (a hang): :meth:`stop` would wait out its grace first.
        The caller decides *that* a child must die; only this layer sends the signal.
        """
        if self._process is None or self.exited.is_set():
            return
        self.log.note(f"killing pid {self._process.pid} (SIGKILL): {reason}")
        log.warning("llama-server %s pid %d: SIGKILL: %s", self.spec.alias, self._process.pid, reason)
        self._signal_group(signal.SIGCONT)
        self._signal_group(signal.SIGKILL)

    async def health(self, timeout: float = 2.0) -> int | None:
        """HTTP status of ``/health`` (200 ready, 503 loading), None when it did not answer."""
        try:
            # verify=False: plain http on loopback; a default client loads the CA bundle (~38 ms CPU).
            async with httpx.AsyncClient(timeout=timeout, trust_env=False, verify=False) as c:
                with socket_gone_as_httpx_error(self.base_url):
                    r = await c.get(f"{self.base_url}/health")
                return r.status_code
        except httpx.HTTPError:
            return None

    async def props(self, timeout: float = 2.0) -> dict[str, object] | None:
        """The parsed ``/props`` answer (``is_sleeping`` among others; it does not wake a sleeping
        server), None when it did not answer in time or answered something else."""
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        try:
            async with httpx.AsyncClient(timeout=timeout, trust_env=False, verify=False) as c:
                r = await c.get(f"{self.base_url}/props", headers=headers)
                answer = r.json() if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return None
        return answer if isinstance(answer, dict) else None

    async def slots(self, timeout: float = 2.0) -> object | None:
        """The parsed ``/slots`` answer (each slot's progress counters), None when it did not
        answer in time or answered something else: what the progress watchdog reads."""
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        try:
            async with httpx.AsyncClient(timeout=timeout, trust_env=False, verify=False) as c:
                r = await c.get(f"{self.base_url}/slots", headers=headers)
                if r.status_code != 200:
                    return None
                answer: object = r.json()
                return answer
        except (httpx.HTTPError, ValueError):
            return None

    async def slot_action(
        self, slot: int, action: str, filename: str | None = None, *, timeout: float = 60.0
    ) -> dict[str, Any]:
        """``POST /slots/{slot}?action=save|restore|erase`` (the child needs ``--slot-save-path``;
        ``filename`` is a bare name inside it). Returns the child's answer (``n_saved``/``n_written``,
        ``n_restored``/``n_read``, ``timings``); raises :class:`InstanceError` with its message when
        it refused, failed, or did not answer within ``timeout``."""
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        body = {"filename": filename} if filename is not None else {}
        what = f"slot {slot} {action}" + (f" ({filename})" if filename else "")
        try:
            async with httpx.AsyncClient(timeout=timeout, trust_env=False, verify=False) as c:
                r = await c.post(
                    f"{self.base_url}/slots/{slot}", params={"action": action}, json=body, headers=headers
                )
                answer = r.json()
        except (httpx.HTTPError, ValueError) as exc:
            # No answer (the child is stopping, or gone): not a refusal of the file.
            raise InstanceError(
                f"{what} failed: {type(exc).__name__}: {exc}", reason="slots_unreachable"
            ) from exc
        if r.status_code != 200 or not isinstance(answer, dict):
            error = answer.get("error") if isinstance(answer, dict) else None
            message = error.get("message") if isinstance(error, dict) else None
            raise InstanceError(f"{what} failed: {message or f'HTTP {r.status_code}'}", reason="slots")
        return answer

    def status(self) -> dict[str, object]:
        return {
            "state": self.state,
            "pid": self.pid,
            "port": self.port,
            "returncode": self.returncode,
            "exit": describe_returncode(self.returncode) if self.exited.is_set() else None,
            "load_seconds": self.load_seconds,
            "log_path": str(self.spec.log_path) if self.spec.log_path else None,
        }

    # -- internals ----------------------------------------------------------------------------

    def _reset_for_retry(self) -> None:
        self._process = None
        self.exited = anyio.Event()
        self._flags.clear()
        self.returncode = None

    def _write_key_file(self) -> Path:
        # The key goes in a 0600 file, not on the command line, where any local user could read it
        # from /proc/<pid>/cmdline.
        base = self._state_dir() / "run"
        base.mkdir(parents=True, exist_ok=True)
        path = base / f"{self.spec.alias.replace('/', '_')}-{secrets.token_hex(4)}.key"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(self.api_key + "\n")
        return path

    def _state_dir(self) -> Path:
        if self.spec.state_dir is not None:
            return self.spec.state_dir
        if self._tmp_state is None:
            self._tmp_state = Path(tempfile.mkdtemp(prefix="forge-child-"))
        return self._tmp_state

    def _remove_key_file(self) -> None:
        if self._key_file is not None:
            self._key_file.unlink(missing_ok=True)
            self._key_file = None

    def _command(self, port: int) -> list[str]:
        assert self._key_file is not None
        return with_parent_death(self.spec.args(port, self._key_file))

    async def _spawn_and_wait(self, port: int) -> None:
        if self._key_file is None:
            self._key_file = self._write_key_file()
        config_home = self._state_dir() / "empty-config"
        config_home.mkdir(parents=True, exist_ok=True)
        env = clean_child_env(
            os.environ if self.spec.parent_env is None else self.spec.parent_env,
            mask=self.spec.mask,
            config_home=config_home,
        )
        cmd = self._command(port)
        self.port = port
        self.log.note("starting: " + " ".join(redact(self.spec.args(port, self._key_file))))
        try:
            self._process = await anyio.open_process(
                cmd,
                stdin=None,
                stdout=subprocess.DEVNULL,  # llama-server logs to stderr; keep our stdout clean
                stderr=-1,  # subprocess.PIPE
                env=env,
                start_new_session=True,
            )
        except OSError as exc:
            raise StartFailed(
                f"could not start {self.spec.binary}: {exc.strerror or exc}",
                hint="run `forge build`, or check FORGE_LLAMA_SERVER",
                reason="crashed",
            ) from exc
        self.pid = self._process.pid
        self._last_output = time.monotonic()
        self.state = "loading"
        assert self._tg is not None
        self._tg.start_soon(self._drain, self._process)
        self._tg.start_soon(self._watch_exit, self._process)
        await self._wait_ready()

    async def _drain(self, proc: anyio.abc.Process) -> None:
        assert proc.stderr is not None

        def seen() -> None:
            self._last_output = time.monotonic()

        async for line in lines_of(proc.stderr, on_chunk=seen):
            self._on_line(line)

    def _on_line(self, line: str) -> None:
        self.log.add(line)
        if "listening on" in line and LISTENING_RE.search(line):
            self.listening_at = time.monotonic()
            self._flags.add("listening")
            self._wake.set()
        elif OOM_PATTERNS.search(line):
            self._flags.add("oom")
            self._wake.set()
        elif BIND_FAILED_RE.search(line):
            self._flags.add("bind")
            self._wake.set()
        elif "computed" not in self._flags and _COMPUTED_RE.search(line):
            self._flags.add("computed")

    @property
    def computed(self) -> bool:
        """It has finished a computation (a request's timings were printed): a later CPU fault is
        not the build failing its first compute."""
        return "computed" in self._flags

    async def _watch_exit(self, proc: anyio.abc.Process) -> None:
        await proc.wait()
        self._mark_exited(proc)

    def _note_unasked_death(self) -> None:
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

    def _mark_exited(self, proc: anyio.abc.Process) -> None:
        if self.exited.is_set() or proc.returncode is None:
            return
        if not self.stop_requested:
            self.died_unasked = True
        self.returncode = proc.returncode
        # Anything the child forked into its group goes too — once, here, right after the exit
        # was seen: later the group id could belong to someone else.
        self._signal_group(signal.SIGKILL)
        was = self.state
        self.state = "exited"
        self.log.note(f"llama-server pid {proc.pid} {describe_returncode(self.returncode)} (while {was})")
        self.exited.set()
        self._wake.set()

    def _signal_group(self, sig: int) -> None:
        if self._process is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._process.pid, sig)

    def _fail(self, reason: str, message: str) -> StartFailed:
        tail = self.log.tail(15)
        return StartFailed(
            f"llama-server for {self.spec.alias!r} failed to start: {message}",
            hint=START_HINTS.get(reason),
            returncode=self.returncode,
            reason=reason,
            stderr_tail=tail,
            log_path=str(self.spec.log_path) if self.spec.log_path else None,
        )

    async def _wait_ready(self) -> None:
        spec = self.spec
        started = time.monotonic()
        delay = 0.002  # first poll within a few ms; backoff capped at 50 ms
        async with httpx.AsyncClient(
            base_url=self.base_url, timeout=httpx.Timeout(2.0, connect=0.5), trust_env=False, verify=False
        ) as client:
            while True:
                if self.stop_requested:
                    await self.stop(timeout=2.0)
                    raise self._fail("cancelled", "stopped while loading")
                if self.exited.is_set():
                    await self._drained()
                    reason = classify_failure(self.log.tail(40))
                    if self.returncode == -signal.SIGILL:
                        reason = "illegal_instruction"
                    raise self._fail(reason, describe_returncode(self.returncode))
                if "oom" in self._flags:
                    await self.stop(timeout=2.0)
                    raise self._fail("oom", "out of device memory while loading")
                now = time.monotonic()
                if now - self._last_output > spec.stall_timeout:
                    await self.stop(timeout=2.0)
                    raise self._fail("timeout", f"no output for {spec.stall_timeout:g} s while loading")
                if spec.ready_timeout is not None and now - started > spec.ready_timeout:
                    await self.stop(timeout=2.0)
                    raise self._fail("timeout", f"not ready after {spec.ready_timeout:g} s")
                status = await self._poll(client)
                if status == 200:
                    self.state = "ready"
                    self.ready_at = time.time()
                    self.ready_monotonic = time.monotonic()
                    self._remove_key_file()  # read at argument parsing: no longer needed on disk
                    return
                self._wake = anyio.Event()
                if "listening" in self._flags:
                    delay = 0.0  # the log says ready: confirm with /health right away
                with anyio.move_on_after(delay):
                    await self._wake.wait()
                delay = min(max(delay * 2, 0.002), 0.05)

    async def _poll(self, client: httpx.AsyncClient) -> int | None:
        try:
            with socket_gone_as_httpx_error(self.base_url):
                r = await client.get("/health")
        except httpx.HTTPError:
            return None
        return r.status_code

    async def _drained(self) -> None:
        """After an exit, give the drain task a moment to read the last lines of the pipe."""
        with anyio.move_on_after(0.5):
            while self._process is not None and self._process.stderr is not None:
                before = self.log.total_lines
                await anyio.sleep(0.02)
                if self.log.total_lines == before:
                    break
