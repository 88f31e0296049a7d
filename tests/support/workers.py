"""Real `forge worker` processes (llama.cpp rpc-server on the CPU) for tests, on OS-chosen ports."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psutil

from rocmforge_supervisor.process import free_port

from .service import forge_process, wait_for


@dataclass
class Worker:
    proc: subprocess.Popen[str]
    address: str
    port: int
    log: Path

    def rpc_servers(self) -> list[psutil.Process]:
        """The rpc-server children (alive, not zombies) of this `forge worker`."""
        try:
            kids = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []
        return [p for p in kids if _is_rpc(p)]


def _is_rpc(p: psutil.Process) -> bool:
    try:
        return "rpc-server" in p.name() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def all_rpc_servers_named(port: int) -> list[psutil.Process]:
    """Every rpc-server on this box listening on ``port`` by its command line (orphans included)."""
    found = []
    for p in psutil.process_iter(["name", "cmdline"]):
        try:
            cmd = p.info["cmdline"] or []
            if _is_rpc(p) and "-p" in cmd and cmd[cmd.index("-p") + 1] == str(port):
                found.append(p)
        except (psutil.Error, IndexError):
            continue
    return found


@contextmanager
def running_worker(
    rpc_server_bin: Path, state_dir: Path, *, port: int | None = None, threads: int = 1
) -> Iterator[Worker]:
    """`forge worker --cpu` on loopback; yields once it printed its address (it is listening)."""
    port = port or free_port()
    log = state_dir / f"worker-{port}.stderr"
    args = ["worker", "--cpu", "-t", str(threads), "--port", str(port), "--rpc-server", str(rpc_server_bin)]
    try:
        with forge_process(args, state_dir, log, stop_timeout=20) as (proc, line):
            assert line == f"127.0.0.1:{port}", f"forge worker did not start: {line!r} {log.read_text()}"
            yield Worker(proc, line, port, log)
    finally:
        wait_for(lambda: not all_rpc_servers_named(port), timeout=10, what=f"rpc-server on {port} gone")
