"""A wedged decode behind the real `forge serve`: the task-loop thread of the real llama-server is
frozen (ptrace) while its HTTP thread answers /health. The watchdog resets the child; a stream in
flight ends with an error event in its dialect; a non-streamed request, of which nothing had reached
the client, is answered by the replacement."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.support.service import model_section, running_service, wait_for, write_config

REPO = Path(__file__).resolve().parents[2]
STALL = 2.0


def _freeze(pid: int) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.support.freeze", str(pid)], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "frozen"
    return proc


def _freeze_when_busy(svc_pid: int, freezers: list[subprocess.Popen[str]], started: threading.Event) -> None:
    started.wait(30)
    freezers.append(_freeze(svc_pid))


@pytest.fixture
def service(tmp_path: Path, llama_server_bin: Path, smollm2_path: Path):  # type: ignore[no-untyped-def]
    cfg = "[server]\n[supervisor]\nrestart_backoff_initial = 0.1\n\n" + model_section(
        "m",
        smollm2_path,
        ctx_size=2048,
        parallel=1,
        preload=True,
        stall_timeout=STALL,
        args=["--threads", "1"],
    )
    with running_service(
        write_config(tmp_path / "forge.toml", cfg), tmp_path / "state", llama_server_bin
    ) as svc:
        yield svc


def _pid(svc) -> int:  # type: ignore[no-untyped-def]
    pid = svc.model("m")["pid"]
    assert isinstance(pid, int)
    return pid


@pytest.mark.parametrize(
    ("path", "body", "error_marker"),
    [
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "Tell me a long story."}]},
            b'"error"',
        ),
        (
            "/v1/messages",
            {"max_tokens": 1500, "messages": [{"role": "user", "content": "A long story."}]},
            b"event: error",
        ),
    ],
)
def test_a_stalled_stream_ends_with_an_error_event(
    service, path: str, body: dict, error_marker: bytes
) -> None:  # type: ignore[no-untyped-def,type-arg]
    first = _pid(service)
    payload = {"model": "m", "stream": True, "max_tokens": 1500, "ignore_eos": True, **body}
    freezer = None
    data = b""
    with (
        service.client() as c,
        c.stream("POST", path, json=payload, headers={"Content-Type": "application/json"}) as r,
    ):
        assert r.status_code == 200
        for chunk in r.iter_raw():
            data += chunk
            if freezer is None and data.count(b"data:") >= 2:
                freezer = _freeze(first)
                frozen_at = time.monotonic()
                assert httpx.get(f"{service.url}/health", timeout=3).status_code == 200
    ended_after = time.monotonic() - frozen_at
    assert error_marker in data[-2000:], data[-500:]
    assert ended_after < STALL + 2 + 2 + 5  # stall_timeout + a poll + a probe, and slack
    row = wait_for(
        lambda: (m := service.model("m"))["state"] == "ready" and m["pid"] != first and m, timeout=30
    )
    assert row["stalls"] == 1
    assert freezer is not None
    freezer.wait(timeout=10)
    assert freezer.stdout is not None
    freezer.stdout.close()


def test_a_stalled_plain_request_is_answered_by_the_replacement(service) -> None:  # type: ignore[no-untyped-def]
    first = _pid(service)
    freezers: list[subprocess.Popen[str]] = []
    busy = threading.Event()
    t = threading.Thread(target=_freeze_when_busy, args=(first, freezers, busy))
    t.start()
    body = {"model": "m", "prompt": "Once upon a time", "max_tokens": 200, "ignore_eos": True}
    with service.client() as c:
        # The freeze lands while the request is being computed (nothing has been sent back yet).
        threading.Timer(0.3, busy.set).start()
        r = c.post("/v1/completions", json=body)
    t.join(30)
    assert r.status_code == 200, r.text
    assert json.loads(r.text)["usage"]["completion_tokens"] == 200
    row = service.model("m")
    assert row["pid"] != first and row["stalls"] == 1
    for f in freezers:
        f.wait(timeout=10)
        assert f.stdout is not None
        f.stdout.close()


def test_a_request_queued_before_a_stall_is_not_replayed_when_its_own_child_dies(service) -> None:  # type: ignore[no-untyped-def]
    """The watchdog's resets count from the moment the request went to its child, not from before
    its queue wait: a plain request that waited behind a stalled stream, then lost the replacement
    to something else (a SIGKILL here, as the OOM killer would) is a 503 at once, not replayed."""
    first = _pid(service)
    out: dict[str, httpx.Response] = {}

    def plain() -> None:
        body = {"model": "m", "prompt": "Once upon a time", "max_tokens": 1500, "ignore_eos": True}
        with service.client() as c:
            out["r"] = c.post("/v1/completions", json=body)

    queued = threading.Thread(target=plain)
    freezer = None
    data = b""
    stream = {"model": "m", "prompt": "A long story", "stream": True, "max_tokens": 1500, "ignore_eos": True}
    with service.client() as c, c.stream("POST", "/v1/completions", json=stream) as r:
        for chunk in r.iter_raw():
            data += chunk
            if freezer is None and data.count(b"data:") >= 2:
                queued.start()  # behind the stream (one slot): queued before the stall
                wait_for(lambda: service.model("m")["waiting"] == 1, timeout=10, what="the queued request")
                freezer = _freeze(first)
    assert b'"error"' in data[-2000:]  # the stream was reset by the watchdog
    second = wait_for(
        lambda: (m := service.model("m"))["pid"] not in (None, first) and m["in_flight"] == 1 and m["pid"],
        timeout=60,
        what="the queued request on the replacement",
    )
    os.kill(second, signal.SIGKILL)
    queued.join(60)
    assert not queued.is_alive()
    r = out["r"]
    assert r.status_code == 503, r.text
    assert "went away while answering" in r.json()["error"]["message"]
    assert service.model("m")["stalls"] == 1
    assert freezer is not None
    freezer.wait(timeout=10)
    assert freezer.stdout is not None
    freezer.stdout.close()
