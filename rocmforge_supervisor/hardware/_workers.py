"""What llama.cpp RPC workers offer: their devices and free memory, asked of the workers themselves.

The question goes through the same llama-server the model will run on
(``llama-server --rpc HOST:PORT --list-devices``; in that order: ``--list-devices`` acts when it is
parsed, before a later ``--rpc`` has added anything). The client names remote devices ``RPC<n>``
and describes each by its worker's address, which is how a line is tied to its worker.

One llama-server per worker, all at once: an unreachable worker makes llama-server fail (it
registers a null backend), and a worker that is serving a model answers nobody else until that
client disconnects (rpc-server serves one client at a time), so each worker gets its own probe
and its own deadline, and a failure names the worker it is about.
"""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from .._argv import probe_argv
from .._errors import UsageError
from ._listing import parse_device_list

__all__ = ["WorkerDevice", "WorkerReport", "discover_workers", "parse_worker_address"]

MiB = 1 << 20

WorkerState = Literal["ok", "unreachable", "busy", "error"]


@dataclass(frozen=True)
class WorkerDevice:
    """One device of one RPC worker, as placement sees it.

    ``index`` is its position among that worker's devices: llama-server puts every RPC device
    before the local ones, in ``--rpc`` order and in each worker's order, and ``--tensor-split``
    follows that order.
    """

    address: str
    index: int
    description: str
    total_bytes: int
    free_bytes: int

    @property
    def key(self) -> str:
        """``rpc:10.0.0.2:50052#0``: stable across probes, unlike the client's ``RPC<n>`` name."""
        return f"rpc:{self.address}#{self.index}"


@dataclass(frozen=True)
class WorkerReport:
    """One worker's answer: its devices, or why there are none."""

    address: str
    state: WorkerState
    devices: tuple[WorkerDevice, ...] = ()
    detail: str = ""

    @property
    def free_bytes(self) -> int:
        return sum(d.free_bytes for d in self.devices)


def parse_worker_address(text: str) -> str:
    """``host:port`` as rpc-server and ``--rpc`` take it; a clear error for anything else."""
    host, sep, port = text.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536 or "," in text:
        raise UsageError(
            f"worker address {text!r} is not HOST:PORT",
            hint='write it like "10.0.0.2:50052" (the port `forge worker` prints)',
        )
    return f"{host}:{int(port)}"


def discover_workers(
    llama_server: Path,
    addresses: Sequence[str],
    *,
    timeout: float = 15.0,
    env: Mapping[str, str] | None = None,
) -> list[WorkerReport]:
    """Ask every worker, in parallel, what devices it has and how much memory is free on each.

    ``llama_server`` must be built with the RPC backend (``forge build --rpc``). Never raises for a
    worker's own trouble: that is the report's ``state`` (``unreachable``, ``busy`` — it did not
    answer within ``timeout``, typically because a model is using it — or ``error``).
    """
    wanted = [parse_worker_address(a) for a in addresses]
    if not wanted:
        return []
    run_env = dict(os.environ if env is None else env)
    # Local GPUs are not the question: hide them so the probe starts fast and lists only workers.
    run_env.update({"HIP_VISIBLE_DEVICES": "-1", "CUDA_VISIBLE_DEVICES": "-1", "GGML_VK_VISIBLE_DEVICES": ""})
    with ThreadPoolExecutor(max_workers=min(8, len(wanted))) as pool:
        return list(pool.map(lambda a: _probe(llama_server, a, timeout, run_env), wanted))


def _accepts(address: str) -> bool:
    """Whether anything accepts a TCP connection on ``address`` (the port is not refused)."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=2.0):
            return True
    except OSError:
        return False


def _probe(binary: Path, address: str, timeout: float, env: Mapping[str, str]) -> WorkerReport:
    # Start-up time: `forge gpus` imports hardware/, and process/ brings anyio and httpx with it.
    from ..process import with_parent_death

    try:
        proc = subprocess.run(
            # Dies with us: a probe of a busy worker waits in its queue, and the timeout is ours.
            with_parent_death(probe_argv(binary, rpc=address)),
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout,
            env=dict(env),
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return WorkerReport(
            address, "busy", detail=f"no answer within {timeout:g} s (serving another llama-server?)"
        )
    except OSError as exc:
        return WorkerReport(address, "error", detail=f"could not run {binary}: {exc.strerror or exc}")
    out = proc.stdout + "\n" + proc.stderr
    if "Failed to connect" in out:
        return WorkerReport(address, "unreachable", detail=f"nothing answers on {address}")
    if "invalid argument: --rpc" in proc.stderr:
        return WorkerReport(
            address,
            "error",
            detail=f"{binary} does not accept --rpc: it was built without the RPC backend "
            "(use `forge build --rpc`)",
        )
    listed = [
        d for d in parse_device_list(proc.stdout) if d.name.startswith("RPC") and d.description == address
    ]
    if not listed:
        if not _accepts(address):  # llama.cpp's log thread can lose "Failed to connect" at exit
            return WorkerReport(address, "unreachable", detail=f"nothing answers on {address}")
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return WorkerReport(address, "error", detail=f"no devices listed for {address}: {last}")
    devices = tuple(
        WorkerDevice(address, i, d.description, d.total_mib * MiB, d.free_mib * MiB)
        for i, d in enumerate(listed)
    )
    return WorkerReport(address, "ok", devices)
