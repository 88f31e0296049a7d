"""SIGTERM to a real `forge serve` with a long-lived client attached: a clean exit in seconds.

Before, uvicorn's graceful shutdown waited the whole drain period for endless responses
(``/api/events``, ``logs?follow=1``, a ``forge load NAME`` waiting on its model) and then cancelled
them with ``CancelledError`` tracebacks; under systemd's TimeoutStopSec that ended in SIGKILL.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest

from tests.support.service import FORGE, Service, running_service, wait_for, write_config

# A long drain period, so that a shutdown waiting on an endless stream could not pass the bound.
CONFIG = """
[supervisor]
drain_timeout = 40
stop_timeout = 5

[models.tiny]
path = "{tiny}"
gpu = "cpu"
ctx_size = 512
preload = true

[models.tinyb]
path = "{tiny}"
gpu = "cpu"
ctx_size = 512
"""
CLEAN_EXIT_S = 8.0


def _reader(svc: Service, path: str, got_bytes: threading.Event, ended: threading.Event) -> None:
    try:
        with httpx.Client(base_url=svc.url, timeout=60) as c, c.stream("GET", path) as r:
            for _ in r.iter_raw():
                got_bytes.set()
    except httpx.HTTPError:
        pass
    finally:
        ended.set()


def _attach_stream(svc: Service, path: str) -> threading.Event:
    got, ended = threading.Event(), threading.Event()
    threading.Thread(target=_reader, args=(svc, path, got, ended), daemon=True).start()
    assert got.wait(30), f"no bytes from {path}"
    return ended


def _attach_load(svc: Service) -> subprocess.Popen[str]:
    """`forge load tinyb` against the service, with the load held: the child SIGSTOPped (a real
    fault) so the CLI is still waiting, watching the event stream, when the SIGTERM comes."""
    env = {**os.environ, "FORGE_STATE_DIR": str(svc.state_dir)}
    cli = subprocess.Popen(
        [*FORGE, "load", "tinyb"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    known = {p.pid for p in svc.llama_children()}
    child = wait_for(
        lambda: next((p for p in svc.llama_children() if p.pid not in known), None), what="tinyb's child"
    )
    child.send_signal(signal.SIGSTOP)
    wait_for(lambda: svc.model("tinyb")["state"] == "loading", what="tinyb loading")
    return cli


@pytest.mark.parametrize("kind", ["events", "logs", "load"])
def test_sigterm_with_a_stream_attached_exits_cleanly(
    kind: str, tmp_path: Path, tiny_gguf: Path, llama_server_bin: Path
) -> None:
    cfg = write_config(tmp_path / "forge.toml", CONFIG.format(tiny=tiny_gguf))
    with running_service(cfg, tmp_path / "state", llama_server_bin) as svc:
        ended: threading.Event | None = None
        cli = None
        if kind == "events":
            ended = _attach_stream(svc, "/api/events?replay=1")
        elif kind == "logs":
            ended = _attach_stream(svc, "/api/models/tiny/logs?follow=1&tail=5")
        else:
            cli = _attach_load(svc)
        children = [p.pid for p in svc.llama_children()]
        t0 = time.monotonic()
        svc.proc.send_signal(signal.SIGTERM)
        rc = svc.proc.wait(timeout=60)
        took = time.monotonic() - t0
        stderr = svc.stderr_text()
        assert rc == 0, stderr
        assert took < CLEAN_EXIT_S, f"shutdown took {took:.1f} s:\n{stderr[-2000:]}"
        assert "Traceback" not in stderr and "CancelledError" not in stderr, stderr[-3000:]
        assert not [
            pid for pid in children if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"
        ]
        if ended is not None:
            assert ended.wait(5), "the client's stream did not end"
        if cli is not None:
            out, _ = cli.communicate(timeout=30)
            assert "Traceback" not in out, out
            assert "stopping" in out, out
