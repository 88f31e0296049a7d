"""Worker discovery against real rpc-servers: devices and free memory per worker, and a clear state
for each way a worker can be missing."""

from __future__ import annotations

from pathlib import Path

import pytest

from rocmforge_supervisor import UsageError
from rocmforge_supervisor.hardware import discover_workers, parse_worker_address
from rocmforge_supervisor.process import free_port
from tests.support.workers import running_worker


def test_two_workers_report_their_cpu(
    rpc_server_bin: Path, rpc_llama_server_bin: Path, tmp_path: Path
) -> None:
    with running_worker(rpc_server_bin, tmp_path) as a, running_worker(rpc_server_bin, tmp_path) as b:
        dead = f"127.0.0.1:{free_port()}"
        reports = discover_workers(rpc_llama_server_bin, [a.address, dead, b.address], timeout=20)
    assert [r.address for r in reports] == [a.address, dead, b.address]
    ra, rdead, rb = reports
    for r in (ra, rb):
        assert r.state == "ok", r.detail
        [dev] = r.devices
        assert dev.key == f"rpc:{r.address}#0"
        assert 0 < dev.free_bytes <= dev.total_bytes
    assert rdead.state == "unreachable" and rdead.devices == (), rdead.detail


def test_a_llama_server_without_rpc_says_so(llama_server_bin: Path, rpc_llama_server_bin: Path) -> None:
    if llama_server_bin == rpc_llama_server_bin:
        pytest.skip("only an RPC build is installed here: nothing without --rpc to ask")
    [r] = discover_workers(llama_server_bin, [f"127.0.0.1:{free_port()}"])
    assert r.state == "error" and "forge build --rpc" in r.detail


@pytest.mark.parametrize("bad", ["10.0.0.2", "host:port", ":50052", "a:1,b:2", "h:70000"])
def test_bad_addresses_are_refused(bad: str) -> None:
    with pytest.raises(UsageError, match="HOST:PORT"):
        parse_worker_address(bad)
