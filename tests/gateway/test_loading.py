"""Loading that clients survive, through a real `forge serve`: ``load_wait`` → 503 + Retry-After +
progress, a load that outlives its client, the size-scaled start deadline, and keep-alive comments
on a stream whose first token is late.

A slow load comes from a slow start, not a fake server: a shell wrapper holds the *real*
llama-server back for a few seconds before exec'ing it (a slow disk, cheaply). A late first token
comes from a real fault: the child is SIGSTOPped while the request waits, then SIGCONTed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.support.service import Service, running_service, wait_for, write_config

DELAY = 3.0  # seconds the wrapper holds a model load back


def _slow_llama_server(tmp_path: Path, real: Path, delay: float) -> Path:
    """The real llama-server, started ``delay`` s late when it loads a model (``--version`` and
    ``--list-devices`` go straight through). SIGTERM during the delay ends it at once."""
    script = tmp_path / "slowbin" / "llama-server"
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(
        "#!/bin/sh\n"
        'case " $* " in *" --model "*)\n'
        "  trap 'kill $pid 2>/dev/null; exit 143' TERM INT\n"
        f"  sleep {delay} & pid=$!; wait $pid ;;\n"
        "esac\n"
        f'exec "{real}" "$@"\n'
    )
    script.chmod(0o755)
    return script


def _config(tmp_path: Path, tiny: Path, server: str = "", supervisor: str = "", model: str = "") -> Path:
    return write_config(
        tmp_path / "forge.toml",
        f"""
[server]
{server}
[supervisor]
health_interval = 30
{supervisor}
[models.tiny]
path = "{tiny}"
gpu = "cpu"
ctx_size = 512
parallel = 1
{model}
""",
    )


CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}


def test_load_wait_gives_503_retry_after_and_progress_then_the_retry_succeeds(
    tmp_path: Path, tiny_gguf: Path, llama_server_bin: Path
) -> None:
    slow = _slow_llama_server(tmp_path, llama_server_bin, DELAY)
    config = _config(tmp_path, tiny_gguf, server="load_wait = 0.5")
    with (
        running_service(config, tmp_path / "state", slow) as svc,
        httpx.Client(base_url=svc.url, timeout=30) as c,
    ):
        r = c.post("/v1/chat/completions", json=CHAT)
        assert r.status_code == 503, r.text
        assert int(r.headers["Retry-After"]) >= 1
        body = r.json()
        assert body["error"]["code"] == "model_loading" and "still loading" in body["error"]["message"]
        assert body["loading"]["state"] == "loading"
        assert (
            body["loading"]["progress"] is None and body["loading"]["eta_seconds"] is None
        )  # no measured load yet
        # The Anthropic route says the same in Anthropic's shape.
        a = c.post("/v1/messages", json={**CHAT, "max_tokens": 3})
        assert (
            a.status_code == 503 and a.json()["type"] == "error" and a.json()["loading"]["state"] == "loading"
        )

        def retried() -> httpx.Response | None:
            r = c.post("/v1/chat/completions", json=CHAT)
            return r if r.status_code == 200 else None

        ok = wait_for(retried, timeout=60, interval=0.5, what="the retry after the load")
        assert ok.json()["choices"][0]["finish_reason"] == "length"

        # A second load of the same model: now progress and ETA come from the measured first load.
        c.post("/api/models/tiny/unload").raise_for_status()
        r = c.post("/v1/chat/completions", json=CHAT)
        assert r.status_code == 503
        loading = r.json()["loading"]
        assert 0.0 <= loading["progress"] < 1.0 and loading["eta_seconds"] >= 1.0

        # The openai SDK honours Retry-After on its own retries: the caller just sees the answer.
        sdk = openai.OpenAI(base_url=f"{svc.url}/v1", api_key="unused", max_retries=5)
        chat = sdk.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "Hi"}], max_tokens=2
        )
        assert chat.choices[0].finish_reason == "length"


def test_a_client_that_disconnects_does_not_cancel_the_load(
    tmp_path: Path, tiny_gguf: Path, llama_server_bin: Path
) -> None:
    slow = _slow_llama_server(tmp_path, llama_server_bin, DELAY)
    config = _config(tmp_path, tiny_gguf)  # load_wait 30 (default): longer than the client waits
    with running_service(config, tmp_path / "state", slow) as svc:
        with pytest.raises(httpx.ReadTimeout), httpx.Client(base_url=svc.url, timeout=0.5) as impatient:
            impatient.post("/v1/chat/completions", json=CHAT)  # gives up, disconnects mid-load
        assert svc.model("tiny")["state"] == "loading"
        wait_for(lambda: svc.model("tiny")["state"] == "ready", timeout=60, what="the load to finish alone")
        first_pid = svc.model("tiny")["pid"]
        # Later requests use that load; nothing was restarted.
        with httpx.Client(base_url=svc.url, timeout=30) as c:
            assert c.post("/v1/chat/completions", json=CHAT).status_code == 200
        assert svc.model("tiny")["pid"] == first_pid and svc.model("tiny")["restarts"] == 0


def test_the_start_deadline_scales_with_model_size(
    tmp_path: Path, tiny_gguf: Path, llama_server_bin: Path
) -> None:
    """base + per-GiB: with a 1 s base (and a ~1 MB file) a 3 s start is past its deadline."""
    slow = _slow_llama_server(tmp_path, llama_server_bin, DELAY)
    config = _config(
        tmp_path,
        tiny_gguf,
        supervisor="load_deadline_base = 1.0\nload_deadline_per_gib = 20\ncrash_loop_max = 1",
    )
    with (
        running_service(config, tmp_path / "state", slow) as svc,
        httpx.Client(base_url=svc.url, timeout=30) as c,
    ):
        r = c.post("/v1/chat/completions", json=CHAT)
        assert r.status_code == 500 and r.headers["x-should-retry"] == "false", r.text  # failed for good
        failed = wait_for(
            lambda: (m := svc.model("tiny"))["state"] == "failed" and m, timeout=30, what="the deadline"
        )
        assert "not ready after 1.0" in failed["last_error"] and "load_deadline" in failed["last_error"]


# -- keep-alive comments ----------------------------------------------------------------------------


@contextmanager
def _stopped(pid: int) -> Iterator[None]:
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


@pytest.fixture
def keepalive_svc(tmp_path: Path, tiny_gguf: Path, llama_server_bin: Path) -> Iterator[Service]:
    config = _config(tmp_path, tiny_gguf, server="sse_keepalive = 0.2", model="preload = true")
    with running_service(config, tmp_path / "state", llama_server_bin) as svc:
        yield svc


def _while_stopped(svc: Service, call: Any) -> Any:
    """Run ``call`` in a thread while the child is stopped for ~1 s after the request reached it
    (the gateway waits on the child's silence: that is the late first token)."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = call()
        except BaseException as exc:  # handed to the test thread
            out["error"] = exc

    with _stopped(svc.model("tiny")["pid"]):
        t = threading.Thread(target=run)
        t.start()
        wait_for(lambda: svc.model("tiny")["in_flight"] == 1, timeout=10, what="the request in flight")
        held = time.monotonic()
        wait_for(lambda: time.monotonic() - held > 1.0, timeout=5, what="the fault's duration")
    t.join(timeout=60)
    assert not t.is_alive()
    if "error" in out:
        raise out["error"]
    return out["value"]


def test_a_stream_with_a_late_first_token_carries_keep_alive_comments(keepalive_svc: Service) -> None:
    svc = keepalive_svc
    body = {**CHAT, "stream": True}

    def raw() -> bytes:
        with (
            httpx.Client(base_url=svc.url, timeout=30) as c,
            c.stream("POST", "/v1/chat/completions", json=body) as r,
        ):
            assert r.status_code == 200
            return b"".join(r.iter_raw())

    data = _while_stopped(svc, raw)
    first_data = data.index(b"data: ")
    assert data[:first_data].count(b": keep-alive\n\n") >= 2
    assert data.rstrip().endswith(b"data: [DONE]")

    # The official SDKs parse it: they skip SSE comments.
    client = openai.OpenAI(base_url=f"{svc.url}/v1", api_key="unused", max_retries=0)
    chunks = _while_stopped(
        svc,
        lambda: list(
            client.chat.completions.create(model="tiny", messages=CHAT["messages"], max_tokens=3, stream=True)
        ),
    )
    assert chunks[-1].choices[0].finish_reason == "length"

    claude = anthropic.Anthropic(base_url=svc.url, api_key="unused", max_retries=0)

    def anthropic_stream() -> str:
        with claude.messages.stream(model="tiny", max_tokens=3, messages=CHAT["messages"]) as s:  # type: ignore[arg-type]
            return "".join(s.text_stream)

    assert _while_stopped(svc, anthropic_stream)

    # curl (what a shell script or a proxy sees): exit 0, the comments, then the events.
    def curl() -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            [
                "curl",
                "-sN",
                "--max-time",
                "30",
                f"{svc.url}/v1/chat/completions",
                "-H",
                "Content-Type: application/json",
                "-d",
                '{"model":"tiny","max_tokens":3,"stream":true,"messages":[{"role":"user","content":"Hi"}]}',
            ],
            capture_output=True,
            check=False,
        )

    out = _while_stopped(svc, curl)
    assert out.returncode == 0 and b": keep-alive" in out.stdout and b"data: [DONE]" in out.stdout


def test_a_quick_error_on_a_stream_keeps_its_real_status(keepalive_svc: Service) -> None:
    with httpx.Client(base_url=keepalive_svc.url, timeout=30) as c:
        r = c.post("/v1/chat/completions", json={**CHAT, "stream": True, "temperature": "hot"})
    assert r.status_code == 400 and "temperature" in r.json()["error"]["message"]


def test_an_error_after_the_keep_alive_commit_is_an_sse_error_event(keepalive_svc: Service) -> None:
    """The child is SIGKILLed while the stream waits (already committed to 200 by the comments):
    the client gets an SSE error event, not a hang and not a broken connection."""
    svc = keepalive_svc
    pid = svc.model("tiny")["pid"]
    os.kill(pid, signal.SIGSTOP)
    try:
        with (
            httpx.Client(base_url=svc.url, timeout=30) as c,
            c.stream("POST", "/v1/chat/completions", json={**CHAT, "stream": True}) as r,
        ):
            assert r.status_code == 200  # committed: the child was silent past the first interval
            body = r.iter_raw()
            first = next(body)  # a comment, while the child is still stopped
            os.kill(pid, signal.SIGKILL)
            data = first + b"".join(body)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
    assert data.startswith(b": keep-alive\n\n")
    event = data.rstrip().rsplit(b"\n\n", 1)[-1]
    assert event.startswith(b"data: {") and b'"error"' in event and b"[DONE]" not in data
    wait_for(lambda: svc.model("tiny")["state"] == "ready", timeout=60, what="the restart")
