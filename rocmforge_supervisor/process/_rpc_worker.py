"""One llama.cpp RPC worker (``ggml-rpc-server``) child, and the loop that keeps it running.

rpc-server is not llama-server: no HTTP, no ``/health``, no API key, and its start-up banner
(``Starting RPC server v…``, the devices, ``transport : TCP``) goes to a block-buffered stdout and
is printed *before* it binds. So readiness is the child owning a listening socket on its port (read
from /proc through psutil; a TCP connect would also succeed against whatever else holds the port).
It serves **one client at a time** (accept, serve until the client closes, accept the next): a
worker belongs to one llama-server while that one is connected.

A failed bind is not an exit code: it prints ``Failed to create server socket`` and exits 0.

The child gets what a llama-server child gets (:mod:`._instance`): its own process group, the
parent-death signal, a cleaned environment with the device mask on top, a drained log in a
:class:`LogRing` (and file).
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import anyio.abc
import psutil

from .._errors import StartFailed
from ._env import clean_child_env
from ._logs import LogRing, lines_of
from ._spawn import with_parent_death
from ._spec import describe_returncode

__all__ = ["RpcWorker", "WorkerEvent", "WorkerSpec", "is_loopback_host", "run_supervised", "worker_specs"]

_BIND_FAILED = re.compile(r"Failed to create server socket")
_NO_DEVICES = re.compile(r"No devices found|error: unknown device|error: invalid device")


def is_loopback_host(host: str) -> bool:
    """``127.x``, ``::1`` and ``localhost``; anything else is reachable from some network."""
    if host == "localhost":
        return True
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except OSError:
        return False
    return all(ipaddress.ip_address(str(i[4][0]).split("%")[0]).is_loopback for i in infos)


@dataclass(frozen=True)
class WorkerSpec:
    """How to run one rpc-server. ``devices``: its ``-d`` names (``ROCm0``, ``CPU``); empty lets it
    choose (every accelerator it sees, else the CPU)."""

    binary: Path
    host: str = "127.0.0.1"
    port: int = 50052
    devices: tuple[str, ...] = ()
    threads: int | None = None
    cache: bool = False
    mask: Mapping[str, str | None] = field(default_factory=dict)
    name: str = "worker"
    log_path: Path | None = None
    ready_timeout: float = 120.0
    stop_timeout: float = 5.0
    parent_env: Mapping[str, str] | None = None
    state_dir: Path | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def args(self) -> list[str]:
        a = [str(self.binary), "-H", self.host, "-p", str(self.port)]
        if self.devices:
            a += ["-d", ",".join(self.devices)]
        if self.threads is not None:
            a += ["-t", str(self.threads)]
        if self.cache:
            a.append("-c")
        return a


class RpcWorker:
    """One run of one rpc-server: :meth:`start` (ready or StartFailed, child gone), then
    :attr:`exited` is set when it ends; :meth:`stop` is idempotent and always reaps."""

    def __init__(self, spec: WorkerSpec, log: LogRing) -> None:
        self.spec = spec
        self.log = log
        self.exited = anyio.Event()
        self.returncode: int | None = None
        self.pid: int | None = None
        self._process: anyio.abc.Process | None = None
        self._bind_failed = False

    async def start(self, tg: anyio.abc.TaskGroup) -> None:
        spec = self.spec
        env = clean_child_env(
            os.environ if spec.parent_env is None else spec.parent_env,
            mask=spec.mask,
            config_home=_empty_config(spec.state_dir),
        )
        cmd = spec.args()
        stdbuf = shutil.which("stdbuf")  # its banner is printf to a pipe: line-buffer it for the log
        full = with_parent_death([stdbuf, "-oL", *cmd] if stdbuf else cmd)
        self.log.note("starting: " + " ".join(cmd))
        try:
            self._process = await anyio.open_process(
                full,
                stdin=None,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        except OSError as exc:
            raise StartFailed(
                f"could not start {spec.binary}: {exc.strerror or exc}",
                hint="run `forge build --rpc`, or pass --rpc-server PATH",
                reason="crashed",
            ) from exc
        self.pid = self._process.pid
        tg.start_soon(self._drain, self._process)
        tg.start_soon(self._watch, self._process)
        await self._wait_ready()

    async def stop(self) -> int | None:
        proc = self._process
        if proc is None:
            return None
        if proc.returncode is None:
            self._signal_group(signal.SIGTERM)
            self._signal_group(signal.SIGCONT)
            with anyio.move_on_after(self.spec.stop_timeout):
                await proc.wait()
            if proc.returncode is None:
                self.log.note(f"no exit {self.spec.stop_timeout:g} s after SIGTERM: sending SIGKILL")
                self._signal_group(signal.SIGKILL)
                with anyio.move_on_after(30):
                    await proc.wait()
        self._mark_exited(proc)
        return self.returncode

    async def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.spec.ready_timeout
        delay = 0.005
        while True:
            if self.exited.is_set() or self._bind_failed:
                await self.stop()
                raise self._failure()
            if self.pid is not None and _listens(self.pid, self.spec.port):
                return
            if time.monotonic() > deadline:
                await self.stop()
                raise StartFailed(
                    f"rpc-server on {self.spec.address} did not listen within {self.spec.ready_timeout:g} s",
                    hint="see the worker log",
                    reason="timeout",
                    stderr_tail=self.log.tail(15),
                )
            with anyio.move_on_after(delay):
                await self.exited.wait()
            delay = min(delay * 2, 0.1)

    def _failure(self) -> StartFailed:
        tail = self.log.tail(15)
        text = "\n".join(tail)
        if self._bind_failed or _BIND_FAILED.search(text):
            return StartFailed(
                f"rpc-server could not listen on {self.spec.address} (the port is in use?)",
                hint="choose another --port, or stop what holds it",
                reason="bind",
                stderr_tail=tail,
            )
        if _NO_DEVICES.search(text):
            return StartFailed(
                f"rpc-server found no usable device for {','.join(self.spec.devices) or 'its default'}",
                hint="check `forge gpus`, or run the worker on the CPU with --cpu",
                reason="bad_args",
                stderr_tail=tail,
            )
        return StartFailed(
            f"rpc-server {describe_returncode(self.returncode)} while starting",
            hint="see the worker log",
            reason="crashed",
            returncode=self.returncode,
            stderr_tail=tail,
        )

    async def _drain(self, proc: anyio.abc.Process) -> None:
        assert proc.stdout is not None
        async for line in lines_of(proc.stdout):
            self._on_line(line)

    def _on_line(self, line: str) -> None:
        self.log.add(line)
        if _BIND_FAILED.search(line):
            self._bind_failed = True

    async def _watch(self, proc: anyio.abc.Process) -> None:
        await proc.wait()
        self._mark_exited(proc)

    def _mark_exited(self, proc: anyio.abc.Process) -> None:
        if self.exited.is_set() or proc.returncode is None:
            return
        self.returncode = proc.returncode
        self._signal_group(signal.SIGKILL)  # anything it forked goes too, while the group is ours
        self.log.note(f"rpc-server pid {proc.pid} {describe_returncode(proc.returncode)}")
        self.exited.set()

    def _signal_group(self, sig: int) -> None:
        if self._process is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._process.pid, sig)


def _listens(pid: int, port: int) -> bool:
    """Whether process ``pid`` itself has a listening TCP socket on ``port``.

    Not a connect: something else may hold the port (then the connect succeeds while the child
    fails to bind), and every connect costs the single-client server an accept.
    """
    try:
        conns = psutil.Process(pid).net_connections(kind="tcp")
    except psutil.Error:
        return False
    return any(c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port for c in conns)


def _empty_config(state_dir: Path | None) -> Path:
    path = (state_dir or Path.home() / ".local/state/rocmforge") / "empty-config"
    path.mkdir(parents=True, exist_ok=True)
    return path


#: Called with (worker name, event, detail): "ready", "exited", "restarting", "failed".
WorkerEvent = Callable[[str, str, str], None]


async def run_supervised(
    spec: WorkerSpec,
    *,
    backoff_initial: float = 1.0,
    backoff_max: float = 30.0,
    stable_after: float = 60.0,
    on_event: WorkerEvent | None = None,
) -> None:
    """Keep one rpc-server running until cancelled: restart with exponential backoff (reset once
    it ran ``stable_after`` seconds). A first start that fails for a reason waiting cannot fix (the
    port is taken, the device does not exist) raises instead: there is nothing to supervise yet."""
    emit = on_event or (lambda _n, _e, _d: None)
    log = LogRing(spec.log_path)
    backoff = backoff_initial
    ever_ready = False
    try:
        while True:
            failed: StartFailed | None = None
            async with anyio.create_task_group() as tg:
                worker = RpcWorker(spec, log)
                try:
                    await worker.start(tg)
                except StartFailed as exc:
                    failed = exc
                else:
                    ever_ready = True
                    started = time.monotonic()
                    emit(spec.name, "ready", f"listening on {spec.address} (pid {worker.pid})")
                    try:
                        await worker.exited.wait()
                    finally:
                        with anyio.CancelScope(shield=True):
                            await worker.stop()
                    if time.monotonic() - started >= stable_after:
                        backoff = backoff_initial
                    emit(spec.name, "exited", describe_returncode(worker.returncode))
                tg.cancel_scope.cancel()
            if failed is not None:
                if not ever_ready and failed.reason in ("bind", "bad_args"):
                    raise failed
                emit(spec.name, "start_failed", failed.message)
            emit(spec.name, "restarting", f"in {backoff:g} s")
            await anyio.sleep(backoff)
            backoff = min(backoff * 2, backoff_max)
    finally:
        log.close()


def worker_specs(
    binary: Path,
    *,
    host: str,
    port: int,
    groups: Sequence[tuple[str, tuple[str, ...], Mapping[str, str | None]]],
    threads: int | None,
    cache: bool,
    log_dir: Path | None,
    state_dir: Path | None,
) -> list[WorkerSpec]:
    """One spec per (name, rpc-server device names, mask) group, on consecutive ports."""
    return [
        WorkerSpec(
            binary=binary,
            host=host,
            port=port + i,
            devices=devices,
            threads=threads,
            cache=cache,
            mask=mask,
            name=name,
            # One file per worker process: two `forge worker`s (other ports) must not share one.
            log_path=(log_dir / f"worker-{name.replace(':', '')}-{port + i}.log") if log_dir else None,
            state_dir=state_dir,
        )
        for i, (name, devices, mask) in enumerate(groups)
    ]
