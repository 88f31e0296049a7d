"""One model server child (llama-server, whisper-server, a command): spawn, drain, watch, know when it is ready or why not, stop.

Only ``process/`` signals a child (here; the stale sweep in ``_ledger``). Its life is an async context::

    async with ModelServer(spec) as server:     # spawned and ready (or StartFailed, child gone)
        ...server.base_url, server.api_key...
        await server.exited.wait()              # noticed at once: a task waits on the process
    # stopped: SIGTERM to its group, bounded wait, SIGKILL; reaped — even if the caller was cancelled

Alive and ready are different things: the child binds its port before it loads the model and
answers 503 until then. Readiness is whichever comes first of the ``listening on`` log line and a
200 from ``/health``; a 503 only proves it is alive.

No orphans: each child runs in its own process group (so a stop reaches anything it forks) and
gets ``PR_SET_PDEATHSIG=SIGKILL`` (through ``setpriv``, or a tiny exec shim), so it dies with the
supervisor even when the supervisor is SIGKILLed and no cleanup runs.

The process part (spawn, drain, readiness, stop, exit) is :class:`._child.ChildProcess`, shared
with every other server forge runs; llama-server's own part is :class:`LlamaServerKind` (its
readiness, its failures) and what this class adds: the port and its retry, the API key file,
``/props``, ``/slots``.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import anyio
import anyio.abc
import httpx

from .._argv import redact
from .._errors import InstanceError, StartFailed, UsageError
from ..client import socket_gone_as_httpx_error
from ._child import ChildProcess, OwnsChild
from ._env import clean_child_env
from ._llama_kind import LlamaServerKind
from ._logs import LogRing
from ._ports import free_port, port_is_free
from ._spec import InstanceSpec, describe_returncode, unwrap_group

__all__ = [
    "LlamaServer",
    "LlamaServerKind",
    "ModelServer",
]  # the kind lives in _llama_kind; kept here for callers


class ModelServer(OwnsChild):
    """One running model server: llama-server, or whisper-server for a ``backend = "whisper"``
    model (its :class:`ChildKind`; the rest is the same). Use as ``async with``; see the module
    docstring."""

    def __init__(self, spec: InstanceSpec) -> None:
        self.spec = spec
        self.api_key = spec.api_key if spec.api_key is not None else secrets.token_urlsafe(24)
        self.log = LogRing(spec.log_path)
        for listener in spec.line_listeners:
            self.log.subscribe(listener)
        self.child = ChildProcess(
            spec.program.kind(spec),
            self.log,
            label=spec.alias,
            host=spec.host,
            readiness=spec.program.readiness(),
        )
        self.started_at: float | None = None  # time.time()
        self.ready_at: float | None = None
        self.ready_monotonic: float | None = None
        self.load_seconds: float | None = None
        self._tg: anyio.abc.TaskGroup | None = None
        self._own_tg: anyio.abc.TaskGroup | None = None
        self._key_file: Path | None = None
        self._tmp_state: Path | None = None  # only when the caller gave no state_dir

    # -- public -------------------------------------------------------------------------------

    @property
    def listening_at(self) -> float | None:
        """Monotonic time the ``listening on`` line was read."""
        return self.child.listening_at

    @property
    def base_url(self) -> str:
        return self.child.base_url

    @property
    def computed(self) -> bool:
        """It has finished a computation (a request's timings were printed): a later CPU fault is
        not the build failing its first compute."""
        return "computed" in self.child.flags

    async def __aenter__(self) -> ModelServer:
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
        await self.stop()  # shielded inside
        if self._own_tg is not None:
            # Outside the shield (cancel scopes must nest); run() has its own shielded cleanup.
            tg, self._own_tg = self._own_tg, None
            await tg.__aexit__(None, None, None)

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[ModelServer] = anyio.TASK_STATUS_IGNORED
    ) -> int | None:
        """The child's whole life, in one task: spawn, wait ready (``task_status.started``), wait
        for the exit. However it ends (stop(), crash, cancellation, start failure) the child is
        stopped and reaped before this returns; the return value is its exit status."""
        if self.state != "new":
            raise RuntimeError("a ModelServer runs once")
        self.child.state = "starting"
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
                        except StartFailed as failed:
                            exc = self._silent_exit(failed, port)
                            if exc.reason != "bind" or attempt == attempts - 1:
                                raise exc from None
                            self.log.note(f"port {port} was taken before the child bound it; retrying")
                            self.child.reset()
                    self.load_seconds = time.monotonic() - started
                    task_status.started(self)
                    await self.exited.wait()
                finally:
                    self.child.note_unasked_death()
                    await self.stop()  # shielded inside
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
        """Idempotent; shielded from cancellation. Returns the exit status (negative: the signal
        that ended it). See :meth:`ChildProcess.stop`."""
        return await self.child.stop(self.spec.stop_timeout if timeout is None else timeout)

    def crash_cause(self, *, amx: bool) -> str | None:
        """After an exit: what it means and what to do (:meth:`LlamaServerKind.crash_cause`);
        ``amx``: this CPU has Intel AMX."""
        return self.child.kind.crash_cause(
            self.log.tail(40), self.returncode, computed=self.computed, amx=amx
        )

    def kill(self, reason: str) -> None:
        """SIGKILL the child's whole process group now, and say why in its log.

        For a child that no longer answers (a hang): :meth:`stop` would wait out its grace first.
        The caller decides *that* a child must die; only this layer sends the signal.
        """
        self.child.kill(reason)

    async def health(self, timeout: float = 2.0) -> int | None:
        """HTTP status of ``/health`` (200 ready, 503 loading; a command's own health path, or 200
        for any answer when it has none), None when it did not answer."""
        path, any_answer = self.spec.program.liveness()
        try:
            # verify=False: plain http on loopback; a default client loads the CA bundle (~38 ms CPU).
            async with httpx.AsyncClient(timeout=timeout, trust_env=False, verify=False) as c:
                with socket_gone_as_httpx_error(self.base_url):
                    r = await c.get(f"{self.base_url}{path}")
                return 200 if any_answer else r.status_code
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

    async def _spawn_and_wait(self, port: int) -> None:
        if self._key_file is None:
            self._key_file = self._write_key_file()
        config_home = self._state_dir() / "empty-config"
        config_home.mkdir(parents=True, exist_ok=True)
        env = clean_child_env(
            os.environ if self.spec.parent_env is None else self.spec.parent_env,
            mask={**self.spec.program.env(), **self.spec.mask},
            config_home=config_home,
        )
        argv = self.spec.args(port, self._key_file)
        assert self._tg is not None
        await self.child.spawn(self._tg, argv, env=env, port=port, shown=redact(argv))
        spec = self.spec
        await self.child.wait_ready(ready_timeout=spec.ready_timeout, stall_timeout=spec.stall_timeout)
        self.ready_at = time.time()
        self.ready_monotonic = time.monotonic()
        self._remove_key_file()  # read at argument parsing: no longer needed on disk

    def _silent_exit(self, exc: StartFailed, port: int) -> StartFailed:
        """A start that ended with nothing in the child's log says no why (llama-server logs from
        a thread of its own, and an exit right after its start can beat it: under CPU load a
        taken port or a missing model file printed nothing 11 times in 15). Then what forge can
        see itself decides: the port held by someone else is a bind failure (retried on another
        port), a model file that is not there is one."""
        if exc.reason != "crashed" or self.child.lines_read > 0 or not self.child.exited.is_set():
            return exc
        if not port_is_free(port, self.spec.host):
            self.log.note(f"it printed nothing, and port {port} is held by another process")
            return self._fail("bind", f"{exc.message.split(': ', 1)[-1]}; port {port} is taken")
        if not self.spec.model_path.exists():
            return self._fail("file_not_found", f"{self.spec.model_path} does not exist")
        return exc

    def _fail(self, reason: str, message: str) -> StartFailed:
        return self.child.kind.failure(reason, message, self.child)


#: The class's former name (it runs any model server), kept for code that imports it.
LlamaServer = ModelServer
