"""`forge worker`: real llama.cpp rpc-server children, supervised — ready, restarted, never orphaned,
and never open to the network by accident."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

from rocmforge_supervisor.process import free_port
from tests.support.service import wait_for
from tests.support.workers import all_rpc_servers_named, running_worker

FORGE = [sys.executable, "-m", "rocmforge_supervisor.cli"]


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def test_worker_listens_and_stops_cleanly(rpc_server_bin: Path, tmp_path: Path) -> None:
    with running_worker(rpc_server_bin, tmp_path) as w:
        assert _listening(w.port)
        [child] = w.rpc_servers()
        assert child.cmdline()[-6:] == ["-H", "127.0.0.1", "-p", str(w.port), "-t", "1"]
        w.proc.send_signal(signal.SIGTERM)
        assert w.proc.wait(timeout=20) == 0
        assert not child.is_running() or child.status() == "zombie"
    log = tmp_path / "logs" / f"worker-cpu-{w.port}.log"
    assert "Starting RPC server" in log.read_text()  # its banner reached the log


def test_two_workers_keep_their_own_logs(rpc_server_bin: Path, tmp_path: Path) -> None:
    """Two `forge worker`s on one state dir (other ports) shared worker-cpu.log: each has its own."""
    with running_worker(rpc_server_bin, tmp_path) as a, running_worker(rpc_server_bin, tmp_path) as b:
        logs = {w.port: tmp_path / "logs" / f"worker-cpu-{w.port}.log" for w in (a, b)}
        for w in (a, b):
            text = logs[w.port].read_text()
            assert f"-p {w.port}" in text  # its own rpc-server's command line
            other = next(p for p in logs if p != w.port)
            assert f"-p {other}" not in text  # not one line of the other worker's


def test_killed_rpc_server_is_restarted(rpc_server_bin: Path, tmp_path: Path) -> None:
    with running_worker(rpc_server_bin, tmp_path) as w:
        [first] = w.rpc_servers()
        first.send_signal(signal.SIGKILL)
        wait_for(
            lambda: [p for p in w.rpc_servers() if p.pid != first.pid] and _listening(w.port),
            timeout=30,
            what="a new rpc-server listening",
        )
        assert "worker cpu: exited killed by SIGKILL" in w.log.read_text()


def test_worker_lines_say_the_supervisors_event_names(rpc_server_bin: Path, tmp_path: Path) -> None:
    """One vocabulary (issue 23): a worker's crash and restart are named as the supervisor names a
    model's (``crash``, ``restart``), through the same restart policy (first backoff 1 s)."""
    with running_worker(rpc_server_bin, tmp_path) as w:
        [first] = w.rpc_servers()
        os.kill(first.pid, signal.SIGKILL)
        # Ready is its replacement listening (the lifecycle's PortBound readiness).
        wait_for(lambda: w.log.read_text().count("[ready]") == 2, timeout=30, what="a second ready line")
    lines = [line for line in w.log.read_text().splitlines() if line.startswith("worker cpu: ")]
    assert lines[:3] == [
        f"worker cpu: listening on 127.0.0.1:{w.port} (pid {first.pid}) [ready]",
        "worker cpu: exited killed by SIGKILL [crash]",
        "worker cpu: restarting in 1 s [restart]",
    ]
    second = re.fullmatch(
        rf"worker cpu: listening on 127\.0\.0\.1:{w.port} \(pid (\d+)\) \[ready\]", lines[3]
    )
    assert second is not None and int(second[1]) != first.pid


def test_no_orphan_when_forge_worker_is_sigkilled(rpc_server_bin: Path, tmp_path: Path) -> None:
    with running_worker(rpc_server_bin, tmp_path) as w:
        [child] = w.rpc_servers()
        os.kill(w.proc.pid, signal.SIGKILL)
        w.proc.wait(timeout=10)
        # No cleanup of ours ran: the parent-death signal alone ends the rpc-server.
        wait_for(lambda: not all_rpc_servers_named(w.port), timeout=10, what="rpc-server gone")
        assert not _listening(w.port)
        assert not child.is_running() or child.status() == "zombie"


def test_non_loopback_bind_needs_the_flag(rpc_server_bin: Path, tmp_path: Path) -> None:
    proc = subprocess.run(
        [*FORGE, "worker", "--host", "0.0.0.0", "--cpu", "--rpc-server", str(rpc_server_bin)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "FORGE_STATE_DIR": str(tmp_path)},
    )
    assert proc.returncode == 2
    assert "no authentication" in proc.stderr and "--allow-network" in proc.stderr
    assert proc.stdout == ""


def test_port_in_use_is_one_clear_error(rpc_server_bin: Path, tmp_path: Path) -> None:
    port = free_port()
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", port))
        holder.listen()
        proc = subprocess.run(
            [*FORGE, "worker", "--cpu", "-t", "1", "--port", str(port), "--rpc-server", str(rpc_server_bin)],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "FORGE_STATE_DIR": str(tmp_path)},
        )
    assert proc.returncode == 1, proc.stderr
    assert f"could not listen on 127.0.0.1:{port}" in proc.stderr.splitlines()[0]
    assert not all_rpc_servers_named(port)


def test_a_dead_worker_is_named_even_under_a_gdb_backtrace() -> None:
    """The lines a split llama-server left when its worker was SIGKILLed (captured from a real run):
    the backtrace's "No such file or directory" must not read as a missing model."""
    from rocmforge_supervisor.process import classify_failure, crash_cause

    lines = [
        "2.44.729.291 E recv failed (bytes_recv=0, size_to_recv=8)",
        "/root/.cache/rocmforge/src/llama.cpp-4df29be4f4c3/ggml/src/ggml-rpc/ggml-rpc.cpp:519: "
        "Remote RPC server crashed or returned malformed response",
        "30\t../sysdeps/unix/sysv/linux/wait4.c: No such file or directory.",
        "360\t../csu/libc-start.c: No such file or directory.",
    ]
    assert classify_failure(lines) == "rpc_worker"
    assert crash_cause(lines) and "RPC worker" in str(crash_cause(lines))
    assert crash_cause(lines[2:]) is None


def _worker_cli(
    args: list[str], tmp_path: Path, rpc_server_bin: Path, **env: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*FORGE, "worker", *args, "--rpc-server", str(rpc_server_bin)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "FORGE_STATE_DIR": str(tmp_path), **env},
    )


def test_a_host_rpc_server_cannot_bind_is_refused_at_once(rpc_server_bin: Path, tmp_path: Path) -> None:
    """rpc-server binds IPv4 literals only: '::1' used to exit quietly and restart forever."""
    for host in ("::1", "localhost", "[::]"):
        proc = _worker_cli(["--host", host, "--cpu"], tmp_path, rpc_server_bin)
        assert proc.returncode == 2, proc.stderr
        assert "IPv4" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
        assert proc.stdout == ""


def test_ports_past_65535_are_refused(rpc_server_bin: Path, tmp_path: Path) -> None:
    """A recorded machine with eight MI300X: eight workers from 65530 would need ports past 65535;
    nothing starts (no restart loop of a worker rpc-server refuses)."""
    machine = Path(__file__).parents[1] / "fixtures" / "sysfs" / "mi300x_8"
    env = {
        "FORGE_SYSFS_ROOT": str(machine / "sys"),
        "FORGE_DEV_ROOT": str(machine / "dev"),
        "FORGE_USE_AMDSMI": "0",
        "FORGE_USE_NVML": "0",
    }
    proc = _worker_cli(["--port", "65530"], tmp_path, rpc_server_bin, **env)
    assert proc.returncode == 2, proc.stderr
    assert "go past 65535" in proc.stderr and "--port 65528" in proc.stderr
    assert not all_rpc_servers_named(65530)
