"""One llama.cpp RPC worker (``ggml-rpc-server``) child, and the loop that keeps it running.

rpc-server is not llama-server: no HTTP, no ``/health``, no API key, and its start-up banner
(``Starting RPC server v…``, the devices, ``transport : TCP``) goes to a block-buffered stdout and
is printed *before* it binds. So readiness is the child owning a listening socket on its port (read
from /proc through psutil; a TCP connect would also succeed against whatever else holds the port).
It serves **one client at a time** (accept, serve until the client closes, accept the next): a
worker belongs to one llama-server while that one is connected.

A failed bind is not an exit code: it prints ``Failed to create server socket`` and exits 0.

The child runs through the same lifecycle as a llama-server child (:class:`._child.ChildProcess`:
its own process group, the parent-death signal, a drained log in a :class:`LogRing` and file, the
same stop), with a cleaned environment and the device mask on top; :class:`RpcServerKind` is all
that is rpc-server's own. :func:`run_supervised` keeps one running with the supervisor's restart
policy and event names (:mod:`._restart`).
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import anyio
import anyio.abc

from .._errors import StartFailed
from ._child import ChildKind, ChildProcess, OwnsChild, PortBound
from ._env import clean_child_env
from ._logs import LogRing
from ._outcomes import describe_returncode
from ._restart import ChildEventFn, RestartPolicy, supervise

__all__ = [
    "RpcServerKind",
    "RpcWorker",
    "WorkerEvent",
    "WorkerSpec",
    "is_loopback_host",
    "run_supervised",
    "worker_specs",
]

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


@dataclass(frozen=True)
class RpcServerKind(ChildKind):
    """rpc-server, as a :class:`ChildKind` (see the module docstring): ready when it owns a
    listening socket on its port; ``Failed to create server socket`` ends the start at once."""

    address: str
    devices: tuple[str, ...] = ()
    ready_timeout: float = 120.0

    program: ClassVar[str] = "rpc-server"
    readiness: ClassVar[PortBound] = PortBound()
    spawn_hint: ClassVar[str] = "run `forge build --rpc`, or pass --rpc-server PATH"
    fail_fast: ClassVar[tuple[tuple[str, re.Pattern[str], str], ...]] = (
        ("bind", _BIND_FAILED, "could not listen"),
    )
    log_on_stdout: ClassVar[bool] = True  # its banner is printf to stdout

    def classify(self, tail: list[str], returncode: int | None) -> str:
        text = "\n".join(tail)
        if _BIND_FAILED.search(text):
            return "bind"
        return "bad_args" if _NO_DEVICES.search(text) else "crashed"

    def failure(self, reason: str, message: str, child: ChildProcess) -> StartFailed:
        known = {
            "bind": (
                f"rpc-server could not listen on {self.address} (the port is in use?)",
                "choose another --port, or stop what holds it",
            ),
            "bad_args": (
                f"rpc-server found no usable device for {','.join(self.devices) or 'its default'}",
                "check `forge gpus`, or run the worker on the CPU with --cpu",
            ),
            "timeout": (
                f"rpc-server on {self.address} did not listen within {self.ready_timeout:g} s",
                "see the worker log",
            ),
        }
        crashed = (f"rpc-server {describe_returncode(child.returncode)} while starting", "see the worker log")
        text, hint = known.get(reason, crashed)
        return StartFailed(
            text,
            hint=hint,
            reason=reason,
            returncode=None if reason in known else child.returncode,
            stderr_tail=child.log.tail(15),
        )


class RpcWorker(OwnsChild):
    """One run of one rpc-server: :meth:`start` (ready or StartFailed, child gone), then
    :attr:`exited` is set when it ends; :meth:`stop` is idempotent and always reaps."""

    def __init__(self, spec: WorkerSpec, log: LogRing) -> None:
        self.spec = spec
        self.log = log
        self.child = ChildProcess(
            RpcServerKind(spec.address, spec.devices, spec.ready_timeout),
            log,
            label=spec.name,
            host=spec.host,
        )

    async def start(self, tg: anyio.abc.TaskGroup) -> None:
        spec = self.spec
        env = clean_child_env(
            os.environ if spec.parent_env is None else spec.parent_env,
            mask=spec.mask,
            config_home=_empty_config(spec.state_dir),
        )
        await self.child.spawn(tg, spec.args(), env=env, port=spec.port)
        await self.child.wait_ready(ready_timeout=spec.ready_timeout)

    async def stop(self) -> int | None:
        return await self.child.stop(self.spec.stop_timeout)

    def ready_words(self) -> str:
        return f"listening on {self.spec.address} (pid {self.pid})"


def _empty_config(state_dir: Path | None) -> Path:
    path = (state_dir or Path.home() / ".local/state/rocmforge") / "empty-config"
    path.mkdir(parents=True, exist_ok=True)
    return path


#: Called with (worker name, event, detail); the events are :class:`ChildEvent`'s, the
#: supervisor's names: "ready", "crash", "restart", "failed".
WorkerEvent = ChildEventFn


async def run_supervised(
    spec: WorkerSpec,
    *,
    backoff_initial: float = 1.0,
    backoff_max: float = 30.0,
    stable_after: float = 60.0,
    on_event: WorkerEvent | None = None,
    policy: RestartPolicy | None = None,
) -> None:
    """Keep one rpc-server running until cancelled: restart with exponential backoff (reset once
    it ran ``stable_after`` seconds). A first start that fails for a reason waiting cannot fix (the
    port is taken, the device does not exist) raises instead: there is nothing to supervise yet.

    ``policy``: the restart policy; by default the backoff above and a breaker that never opens: a
    worker has nobody to reset one (no ``forge load``), and is what systemd or Kubernetes already
    keep restarting, so it keeps trying, at most every ``backoff_max`` seconds."""
    if policy is None:
        policy = RestartPolicy(
            backoff_initial=backoff_initial,
            backoff_max=backoff_max,
            stable_after=stable_after,
            crash_loop_max=None,
            crash_loop_window=stable_after,
        )
    log = LogRing(spec.log_path)
    try:
        await supervise(
            spec.name,
            lambda: RpcWorker(spec, log),
            policy,
            on_event=on_event,
            fatal_first=frozenset({"bind", "bad_args"}),
        )
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
