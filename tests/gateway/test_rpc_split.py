"""One model split across two real `forge worker`s (llama.cpp rpc-server, CPU) by `forge serve`:
token-identical to one process, and a worker that dies is named, planned around, and used again.

The reference model is the same GGUF in one llama-server with ``--no-repack``: the local CPU
backend otherwise repacks weights for other kernels (the workers' CPU backend does not) and sums
in another order, which changes some greedy tokens.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.service import Service, running_service, wait_for, write_config
from tests.support.workers import all_rpc_servers_named, running_worker

FORGE = [sys.executable, "-m", "rocmforge_supervisor.cli"]
PROMPTS = [
    "The capital of France is",
    "Write a haiku about the sea:",
    "def fibonacci(n):",
    "Three reasons to learn Rust:",
]


def _config(path: Path, workers: list[str]) -> Path:
    listed = "".join(f'[[workers]]\naddress = "{w}"\n' for w in workers)
    return write_config(
        path,
        f"""
[server]
host = "127.0.0.1"
[supervisor]
restart_backoff_initial = 0.5
restart_backoff_max = 2
{listed}
[models.split]
path = "gemma-3-270m"
ctx_size = 1024
parallel = 1
workers = "all"
preload = true

[models.single]
path = "gemma-3-270m"
ctx_size = 1024
parallel = 1
workers = "never"
args = ["--no-repack"]
preload = true
""",
    )


def _complete(svc: Service, model: str, prompt: str, max_tokens: int = 48) -> httpx.Response:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "seed": 1}
    with svc.client() as c:
        return c.post("/v1/completions", json=body, timeout=300)


def _workers_of(svc: Service, name: str) -> list[str]:
    return [str(w["worker"]) for w in svc.model(name)["workers"]]


@pytest.mark.timeout(900)
def test_split_matches_one_process_and_survives_a_dead_worker(
    rpc_server_bin: Path, rpc_llama_server_bin: Path, tmp_path: Path
) -> None:
    with (
        running_worker(rpc_server_bin, tmp_path / "wa") as a,
        running_worker(rpc_server_bin, tmp_path / "wb") as b,
    ):
        cfg = _config(tmp_path / "forge.toml", [a.address, b.address])
        with running_service(cfg, tmp_path / "state", rpc_llama_server_bin) as svc:
            split = svc.model("split")
            assert _workers_of(svc, "split") == [a.address, b.address]
            assert split["devices"] == [f"rpc:{a.address}#0", f"rpc:{b.address}#0"]
            assert svc.model("single")["workers"] == []
            ps = subprocess.run(
                [*FORGE, "ps", "--config", str(cfg)],
                capture_output=True,
                text=True,
                timeout=60,
                env={**os.environ, "FORGE_STATE_DIR": str(svc.state_dir), "COLUMNS": "250"},
            )
            assert ps.returncode == 0, ps.stderr
            assert f"{a.address} " in ps.stdout and f"{b.address} " in ps.stdout  # who holds which share
            for prompt in PROMPTS:
                got = _complete(svc, "split", prompt).json()["choices"][0]["text"]
                want = _complete(svc, "single", prompt).json()["choices"][0]["text"]
                assert got == want, prompt

            # A long request in flight, then worker A dies with its rpc-server (SIGKILL, no cleanup).
            result: dict[str, Any] = {}

            def long_request() -> None:
                result["r"] = _complete(svc, "split", "Tell me a very long story:", max_tokens=2000)

            t = threading.Thread(target=long_request)
            t.start()
            wait_for(lambda: svc.model("split")["in_flight"] == 1, timeout=30, what="request in flight")
            os.kill(a.proc.pid, signal.SIGKILL)
            a.proc.wait(timeout=10)
            t.join(timeout=120)
            r = result["r"]
            # The child died of its own (its worker gone): a clean 503 with Retry-After, not a hang;
            # only a child the watchdog reset is retried (tests/gateway/test_stall.py).
            assert r.status_code == 503 and "error" in r.json() and r.headers.get("retry-after"), r.text
            wait_for(
                lambda: svc.model("split")["state"] == "ready" and _workers_of(svc, "split") == [b.address],
                timeout=120,
                what="split re-planned on worker B alone",
            )
            assert "RPC worker" in (svc.model("split")["last_crash"] or "")  # recovered: kept as history
            assert _complete(svc, "split", PROMPTS[0]).status_code == 200
            wait_for(lambda: not all_rpc_servers_named(a.port), timeout=10, what="A's rpc-server gone")

            # Worker A comes back on its address: the next plan uses it again.
            with running_worker(rpc_server_bin, tmp_path / "wa2", port=a.port):
                with svc.client() as c:
                    assert c.post("/api/models/split/unload").status_code == 200
                    assert c.post("/api/models/split/load", timeout=300).status_code == 200
                assert _workers_of(svc, "split") == [a.address, b.address]
                assert _complete(svc, "split", PROMPTS[0]).status_code == 200

                # A reload that changes the model: its workers serve one client at a time, so the
                # old child is stopped before the new one starts (a replacement started first
                # would wait for the held workers forever, and the reload with it).
                old_pid = svc.model("split")["pid"]
                cfg.write_text(
                    cfg.read_text().replace(
                        'ctx_size = 1024\nparallel = 1\nworkers = "all"',
                        'ctx_size = 2048\nparallel = 1\nworkers = "all"',
                    )
                )
                with svc.client() as c:
                    r = c.post("/api/reload", timeout=300)
                assert r.status_code == 200, r.text
                assert "split" in r.json()["changed"] and "split" not in r.json().get("failed", [])
                wait_for(lambda: svc.model("split")["state"] == "ready", timeout=300, what="split reloaded")
                assert svc.model("split")["pid"] != old_pid
                assert _workers_of(svc, "split") == [a.address, b.address]
                assert _complete(svc, "split", PROMPTS[0]).status_code == 200
