"""One llama-server child: spawn, drain, watch, know when it is ready or why not, stop.

This module is the only place that sends signals to a child. Its life is an async context::

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
import os
import secrets
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Literal

import anyio
import anyio.abc
import httpx

from .._errors import StartFailed, UsageError
from ._env import clean_child_env
from ._logs import BIND_FAILED_RE, LISTENING_RE, OOM_PATTERNS, LogRing, classify_failure
from ._ports import free_port, port_is_free
from ._spawn import with_parent_death

__all__ = [
    "InstanceSpec",
    "InstanceState",
    "LlamaServer",
    "describe_returncode",
    "unwrap_group",
]

InstanceState = Literal["new", "starting", "loading", "ready", "stopping", "exited"]

_HINTS = {
    "file_not_found": "check the model path",
    "invalid_model": "the file is not a loadable GGUF: re-download it or check `forge inspect`",
    "unsupported": "this llama-server does not know the model's architecture: update llama.cpp or use another model",
    "oom": "not enough device memory: lower --ctx-size or --n-gpu-layers, or use a smaller quant",
    "bind": "the port is in use: choose another --port or leave it unset",
    "timeout": "the load stalled or ran past its deadline: check the log; for very large models raise supervisor.load_stall_timeout or load_deadline_base / load_deadline_per_gib",
    "bad_args": "an extra llama-server argument was rejected: check `args` / the flags you passed",
    "rpc_worker": "an RPC worker is down or unreachable: check `forge worker` on that machine",
    "cancelled": "it was stopped on request",
    "crashed": "see the log lines above",
}


def describe_returncode(rc: int | None) -> str:
    if rc is None:
        return "still running"
    if rc < 0:
        try:
            return f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exited with code {rc}"


@dataclass
class InstanceSpec:
    """How to run one llama-server. ``None`` values are left to llama-server's own defaults."""

    binary: Path
    model_path: Path
    alias: str
    ctx_size: int | None = None
    n_gpu_layers: int | str | None = None  # int, "auto", "all"
    parallel: int | None = None
    extra_args: Sequence[str] = ()
    host: str = "127.0.0.1"
    port: int | None = None  # None: a free one, retried if the bind races
    mask: Mapping[str, str | None] = field(default_factory=dict)
    cpu_only: bool = False
    log_path: Path | None = None
    state_dir: Path | None = None  # for the api-key file and the empty config home
    stall_timeout: float = 300.0  # no output at all for this long while loading: give up
    ready_timeout: float | None = None  # overall cap on loading (None: only the stall timeout)
    stop_timeout: float = 10.0
    verbosity: int | None = None
    parent_env: Mapping[str, str] | None = None
    line_listeners: Sequence[Callable[[str], None]] = ()
    bind_retries: int = 3

    def args(self, port: int, api_key_file: Path) -> list[str]:
        a = [
            str(self.binary),
            "--model", str(self.model_path),
            "--host", self.host,
            "--port", str(port),
            "--alias", self.alias,
            "--api-key-file", str(api_key_file),
            "--metrics",
            "--no-webui",
            "--log-colors", "off",
        ]  # fmt: skip
        if self.ctx_size is not None:
            a += ["--ctx-size", str(self.ctx_size)]
        if self.cpu_only:
            a += ["--device", "none"]  # no offload at all (an -ngl would only add warnings)
        elif self.n_gpu_layers is not None:
            a += ["--n-gpu-layers", str(self.n_gpu_layers)]
        if self.parallel is not None:
            a += ["--parallel", str(self.parallel)]
        if self.verbosity is not None:
            a += ["--log-verbosity", str(self.verbosity)]
        a += list(self.extra_args)
        return a


class LlamaServer:
    """One running llama-server. Use as ``async with``; see the module docstring."""

    def __init__(self, spec: InstanceSpec) -> None:
        self.spec = spec
        self.state: InstanceState = "new"
        self.port: int | None = None
        self.pid: int | None = None
        self.returncode: int | None = None
        self.api_key = secrets.token_urlsafe(24)
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
        self._stop_lock = anyio.Lock()
        self.stop_requested = False

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

    def signal(self, sig: int) -> None:
        """For fault tests and the supervisor's hang handling: signal the child process only."""
        if self._process is not None and not self.exited.is_set():
            os.kill(self._process.pid, sig)

    async def health(self, timeout: float = 2.0) -> int | None:
        """HTTP status of ``/health`` (200 ready, 503 loading), None when it did not answer."""
        try:
            # verify=False: plain http on loopback; a default client loads the CA bundle (~38 ms CPU).
            async with httpx.AsyncClient(timeout=timeout, trust_env=False, verify=False) as c:
                r = await c.get(f"{self.base_url}/health")
                return r.status_code
        except httpx.HTTPError:
            return None

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
        base = (self.spec.state_dir or Path.home() / ".local/state/rocmforge") / "run"
        base.mkdir(parents=True, exist_ok=True)
        path = base / f"{self.spec.alias.replace('/', '_')}-{secrets.token_hex(4)}.key"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(self.api_key + "\n")
        return path

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
        state_dir = self.spec.state_dir or Path.home() / ".local/state/rocmforge"
        config_home = state_dir / "empty-config"
        config_home.mkdir(parents=True, exist_ok=True)
        env = clean_child_env(
            os.environ if self.spec.parent_env is None else self.spec.parent_env,
            mask=self.spec.mask,
            config_home=config_home,
        )
        cmd = self._command(port)
        self.port = port
        self.log.note("starting: " + " ".join(_redact(self.spec.args(port, self._key_file))))
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
        pending = b""
        try:
            async for chunk in proc.stderr:
                self._last_output = time.monotonic()
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for raw in lines:
                    self._on_line(raw.decode("utf-8", "replace").rstrip("\r"))
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass
        if pending:
            self._on_line(pending.decode("utf-8", "replace"))

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

    async def _watch_exit(self, proc: anyio.abc.Process) -> None:
        await proc.wait()
        self._mark_exited(proc)

    def _mark_exited(self, proc: anyio.abc.Process) -> None:
        if self.exited.is_set() or proc.returncode is None:
            return
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
            hint=_HINTS.get(reason),
            exit_code=self.returncode,
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


def unwrap_group(exc: BaseException) -> BaseException:
    """A start failure inside a task group arrives as an ExceptionGroup of one: hand out the one."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


_SECRET_FLAGS = ("token", "key", "password", "secret")


def _redact(args: list[str]) -> list[str]:
    """Values of secret-looking flags (``--hf-token X``) never reach the log."""
    out: list[str] = []
    hide_next = False
    for a in args:
        if hide_next:
            out.append("***")
            hide_next = False
            continue
        name, eq, _ = a.partition("=")
        secret = (
            name.startswith("-")
            and any(w in name.lower() for w in _SECRET_FLAGS)
            and not name.endswith("-file")
        )
        if secret and eq:
            out.append(f"{name}=***")
        else:
            out.append(a)
            hide_next = secret
    return out
