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

from tests.support.service import FORGE, Service, model_section, running_service, wait_for, write_config

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


def _holding_binary(tmp_path: Path, real: Path) -> Path:
    """The real llama-server behind a wrapper that stops itself (SIGSTOP, a real fault) before it
    execs when started as ``tinyb``: that load is held from its first instant. (Stopping the child
    from the test raced the tiny model's 0.1 s load, which sometimes finished first.)"""
    wrapper = tmp_path / "holding-bin" / "llama-server"
    wrapper.parent.mkdir()
    wrapper.write_text(
        f'#!/bin/bash\nfor a in "$@"; do [ "$a" = tinyb ] && kill -STOP $$; done\nexec "{real}" "$@"\n'
    )
    wrapper.chmod(0o755)
    return wrapper


def _attach_load(svc: Service) -> subprocess.Popen[str]:
    """`forge load tinyb` against the service, with the load held (the child stopped itself) so the
    CLI is still waiting, watching the event stream, when the SIGTERM comes."""
    env = {**os.environ, "FORGE_STATE_DIR": str(svc.state_dir)}
    known = {p.pid for p in svc.llama_children()}
    cli = subprocess.Popen(
        [*FORGE, "load", "tinyb"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )

    def held() -> bool:
        fresh = [p for p in svc.llama_children() if p.pid not in known]
        return bool(fresh) and all(p.status() == psutil.STATUS_STOPPED for p in fresh)

    wait_for(held, what="tinyb's child, stopped")
    wait_for(lambda: svc.model("tinyb")["state"] == "loading", what="tinyb loading")
    return cli


@pytest.mark.parametrize("kind", ["events", "logs", "load"])
def test_sigterm_with_a_stream_attached_exits_cleanly(
    kind: str, tmp_path: Path, tiny_gguf: Path, llama_server_bin: Path
) -> None:
    cfg = write_config(tmp_path / "forge.toml", CONFIG.format(tiny=tiny_gguf))
    binary = _holding_binary(tmp_path, llama_server_bin) if kind == "load" else llama_server_bin
    with running_service(cfg, tmp_path / "state", binary) as svc:
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


# -- issue 19, item 1: SIGTERM with chat streams in flight -------------------------------------------

#: Runs per moment of the SIGTERM: 3 moments x 7 = 21 shutdowns, each with two streams in flight.
_RUNS = 7
_STREAM_TOKENS = 120
DRAIN_EXIT_S = 20.0  # the streams (~1 s on the tiny model) plus the child's stop; up to ~17 s was seen
# with the 2 cores saturated by other work (streams whole): still half the 40 s drain period that
# the bug this guards against waited out


class _Stream:
    """One streamed chat read on a thread: every ``data:`` line, and how the stream ended."""

    def __init__(self, svc: Service) -> None:
        self.events: list[str] = []
        self.error: str | None = None
        self.first = threading.Event()
        self.ended = threading.Event()
        threading.Thread(target=self._read, args=(svc,), daemon=True).start()

    def _read(self, svc: Service) -> None:
        body = {
            "model": "tiny",
            "stream": True,
            "max_tokens": _STREAM_TOKENS,
            "messages": [{"role": "user", "content": "Tell me a long story."}],
        }
        try:
            with svc.client() as c, c.stream("POST", "/v1/chat/completions", json=body) as r:
                for line in r.iter_lines():
                    if line.startswith("data:"):
                        self.events.append(line)
                        self.first.set()
        except httpx.HTTPError as exc:
            self.error = repr(exc)
        finally:
            self.first.set()
            self.ended.set()

    def whole(self) -> bool:
        """Every token, then ``[DONE]``, and no error event (a child cut mid-stream sends one)."""
        tokens = [e for e in self.events if '"content":"' in e]
        return (
            self.error is None
            and bool(self.events)
            and self.events[-1] == "data: [DONE]"
            and not any('"error"' in e for e in self.events)
            and len(tokens) >= _STREAM_TOKENS
        )


def _sigterm_when(moment: str, svc: Service, streams: list[_Stream], ready_at: float) -> None:
    if moment == "first-token":
        assert any(s.first.wait(30) for s in streams)
    elif moment == "ready+0.5s":
        time.sleep(max(0.0, ready_at + 0.5 - time.monotonic()))  # the moment under test, not a wait
    else:  # mid-stream
        wait_for(lambda: len(streams[0].events) >= _STREAM_TOKENS // 2 or streams[0].ended.is_set())
    svc.proc.send_signal(signal.SIGTERM)


@pytest.mark.parametrize("moment", ["first-token", "ready+0.5s", "mid-stream"])
def test_sigterm_with_chat_streams_in_flight_drains_them_and_exits(
    moment: str, tmp_path: Path, llama_server_bin: Path
) -> None:
    """The drain is deterministic: every run, both streams end whole and the service exits 0 in
    seconds (issue 19, 1: 4 of 5 runs cut a stream and then waited out the drain period)."""
    from tests.support.tiny_gguf import CHATML_TEMPLATE, write_tiny_gguf

    model = write_tiny_gguf(tmp_path / "chat.gguf", chat_template=CHATML_TEMPLATE)
    cfg = write_config(
        tmp_path / "forge.toml",
        "[supervisor]\ndrain_timeout = 40\nstop_timeout = 5\n"
        + model_section("tiny", model, preload=True, parallel=2, ctx_size=2048),
    )
    for run in range(_RUNS):
        with running_service(cfg, tmp_path / f"state-{run}", llama_server_bin) as svc:
            ready_at = time.monotonic()
            streams = [_Stream(svc), _Stream(svc)]
            _sigterm_when(moment, svc, streams, ready_at)
            t0 = time.monotonic()
            try:
                rc = svc.proc.wait(timeout=DRAIN_EXIT_S)
            except subprocess.TimeoutExpired:
                rc = None
            took = time.monotonic() - t0
            stderr = svc.stderr_text()
            where = f"run {run} ({moment}): exit {rc} after {took:.1f} s"
            assert rc == 0, f"{where}\n{stderr[-2500:]}"
            for s in streams:
                assert s.ended.wait(5), where
                assert s.whole(), f"{where}: stream cut: {s.error} {s.events[-2:]}\n{stderr[-2500:]}"
            assert "Traceback" not in stderr, stderr[-3000:]


def test_children_do_not_hold_the_gateway_listener(
    tmp_path: Path, tiny_gguf: Path, llama_server_bin: Path
) -> None:
    """A llama-server that inherited the gateway's listening socket kept it open after the gateway
    closed it at SIGTERM: new connections were queued by the kernel and never answered."""
    cfg = write_config(tmp_path / "forge.toml", CONFIG.format(tiny=tiny_gguf))
    with running_service(cfg, tmp_path / "state", llama_server_bin) as svc:
        port = int(svc.url.rsplit(":", 1)[1])
        children = svc.llama_children()
        assert children
        for child in children:
            held = [c.laddr.port for c in child.net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN]
            assert port not in held, f"llama-server pid {child.pid} holds the gateway's port {port}: {held}"


def test_ctrl_c_says_what_was_stopped(tmp_path: Path, tiny_gguf: Path, llama_server_bin: Path) -> None:
    """Ctrl-C on `make run` printed nothing (issue 37): its last line says it stopped, and what."""
    cfg = write_config(tmp_path / "forge.toml", CONFIG.format(tiny=tiny_gguf))
    with running_service(cfg, tmp_path / "state", llama_server_bin) as svc:
        wait_for(lambda: svc.model("tiny")["state"] == "ready", timeout=60, what="tiny ready")
        svc.proc.send_signal(signal.SIGINT)
        assert svc.proc.wait(timeout=60) == 0
        last = svc.stderr_text().strip().splitlines()[-1]
    assert last == f"stopped (SIGINT): forge serve at {svc.url} and the llama-server of tiny", last
