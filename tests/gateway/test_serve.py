"""`forge serve` end to end: real service process, real llama-server children, the official openai SDK."""

from __future__ import annotations

import concurrent.futures
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import psutil
import pytest

from rocmforge_supervisor.service.ops._client import ServiceClient
from tests.support.service import FAST, FORGE, model_section, running_service, wait_for, write_config


@pytest.fixture
def two_models(tmp_path: Path, tiny_gguf: Path) -> Path:
    other = tmp_path / "tiny-b.gguf"
    shutil.copy(tiny_gguf, other)
    return write_config(
        tmp_path / "forge.toml",
        FAST
        + model_section("tiny", tiny_gguf, preload=True, parallel=2)
        + model_section("tinyb", other, parallel=2),
    )


def test_openai_sdk_chat_and_completions_two_models(
    two_models: Path, tmp_path: Path, llama_server_bin: Path
) -> None:
    with running_service(two_models, tmp_path / "state", llama_server_bin) as svc:
        client = openai.OpenAI(base_url=f"{svc.url}/v1", api_key="unused")
        ids = {m.id for m in client.models.list().data}
        assert ids == {"tiny", "tinyb"}

        chat = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "Hi"}], max_tokens=5
        )
        assert chat.choices[0].finish_reason == "length"
        assert chat.usage is not None and chat.usage.completion_tokens == 5

        pieces = [
            c.choices[0].delta.content or ""
            for c in client.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "Hi"}], max_tokens=6, stream=True
            )
            if c.choices
        ]
        assert "".join(pieces)

        comp = client.completions.create(model="tinyb", prompt="Once", max_tokens=4)  # loads on demand
        assert comp.choices[0].text
        streamed = list(client.completions.create(model="tinyb", prompt="Once", max_tokens=4, stream=True))
        assert streamed[-1].choices[0].finish_reason == "length"

        # Two models at once.
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            futs = [
                pool.submit(
                    lambda m: client.completions.create(model=m, prompt="x", max_tokens=8).choices[0].text, m
                )
                for m in ("tiny", "tinyb", "tiny", "tinyb")
            ]
            assert all(f.result(timeout=60) for f in futs)

        with pytest.raises(openai.NotFoundError):
            client.completions.create(model="nope", prompt="x", max_tokens=1)

        with svc.client() as c:
            assert c.get("/health").json() == {"status": "ok"}
            assert c.get("/ready").status_code == 200
            metrics = c.get("/metrics").text
            assert 'forge_requests_total{endpoint="/v1/completions",model="tinyb",status="200"}' in metrics
            assert 'llamacpp:tokens_predicted_total{model="tiny"}' in metrics
            assert 'forge_model_state{model="tiny",state="ready"} 1.0' in metrics
            r = c.get("/v1/models", headers={"X-Request-ID": "abc123"})
            assert r.headers["x-request-id"] == "abc123"
            assert c.get("/api/openapi.json").json()["paths"]


def test_child_sigkill_mid_stream_clean_error_then_restart(
    tmp_path: Path, gemma_path: Path, llama_server_bin: Path
) -> None:
    # The real gemma model: slow enough (~70 tokens/s here) that the kill lands mid-stream.
    cfg = write_config(tmp_path / "forge.toml", FAST + model_section("tiny", gemma_path, preload=True))
    with running_service(cfg, tmp_path / "state", llama_server_bin) as svc:
        before = svc.model("tiny")
        pid = before["pid"]
        body = {"model": "tiny", "prompt": "Go", "max_tokens": 900, "stream": True}
        events: list[str] = []
        with svc.client() as c, c.stream("POST", "/v1/completions", json=body) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if line.startswith("data: "):
                    events.append(line[6:])
                    if len(events) == 2:
                        os.kill(pid, signal.SIGKILL)  # fault injection
        assert len(events) > 2
        last = json.loads(events[-1])
        assert "error" in last and "tiny" in last["error"]["message"]
        assert events[-1] != "[DONE]"

        m = wait_for(
            lambda: (s := svc.model("tiny"))["state"] == "ready" and s["pid"] != pid and s, what="restart"
        )
        assert m["restarts"] >= 1
        with svc.client() as c:
            r = c.post("/v1/completions", json={"model": "tiny", "prompt": "again", "max_tokens": 3})
            assert r.status_code == 200 and r.json()["choices"][0]["text"]


def test_crash_loop_opens_the_breaker(tmp_path: Path, tiny_gguf: Path, llama_server_bin: Path) -> None:
    cfg = write_config(
        tmp_path / "forge.toml",
        FAST.replace("[supervisor]", "[supervisor]\ncrash_loop_max = 3\ncrash_loop_window = 120")
        + model_section("tiny", tiny_gguf, preload=True),
    )
    with running_service(cfg, tmp_path / "state", llama_server_bin) as svc:
        killed: set[int] = set()
        for _ in range(3):
            m = wait_for(
                lambda: (
                    (s := svc.model("tiny"))["state"] == "failed"
                    or ((s["state"] == "ready" and s["pid"] and s["pid"] not in killed) and s)
                ),
                what="ready or failed",
            )
            if m["state"] == "failed":
                break
            killed.add(m["pid"])
            os.kill(m["pid"], signal.SIGKILL)  # fault injection
        m = wait_for(lambda: (s := svc.model("tiny"))["state"] == "failed" and s, what="failed")
        assert len(killed) == 3
        assert "crashes" in m["last_error"]
        with svc.client() as c:
            r = c.post("/v1/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 1})
            # Failed for good (until reset): not a 503 that SDKs retry.
            assert r.status_code == 500 and r.headers["x-should-retry"] == "false"
            assert "failed" in r.json()["error"]["message"] and r.json()["error"]["code"] == "crash_loop"
            # `forge load NAME` resets the breaker.
            r = c.post("/api/models/tiny/load")
            assert r.status_code == 200 and r.json()["state"] == "ready"


def test_a_child_killed_each_time_it_comes_up_fails_with_its_own_cause(
    tmp_path: Path, tiny_gguf: Path, llama_server_bin: Path
) -> None:
    """What an OOM killer does: every new child is SIGKILLed as soon as it exists (while the
    supervisor polls it coming up, health checks every 50 ms), until the breaker opens. The
    reason is the kill, never an error from a connection to the dying child (issue 19, 5: it
    read ``internal error: AttributeError("'NoneType' object has no attribute 'getpeername'")``)."""
    cfg = write_config(
        tmp_path / "forge.toml",
        FAST.replace("[supervisor]", "[supervisor]\ncrash_loop_max = 3\ncrash_loop_window = 120")
        .replace("health_interval = 0.5", "health_interval = 0.05")
        .replace("restart_backoff_initial = 0.2", "restart_backoff_initial = 0.05")
        + model_section("tiny", tiny_gguf, preload=True),
    )
    with running_service(cfg, tmp_path / "state", llama_server_bin, wait_ready=False) as svc:
        killed: set[int] = set()

        def kill_new_children() -> bool:
            for p in svc.llama_children():
                if p.pid not in killed:
                    killed.add(p.pid)
                    os.kill(p.pid, signal.SIGKILL)  # fault injection
            try:
                return bool(svc.model("tiny")["state"] == "failed")
            except httpx.HTTPError:  # the gateway is not up yet
                return False

        wait_for(kill_new_children, timeout=60, interval=0.005, what="the breaker to open")
        m = svc.model("tiny")
        assert len(killed) >= 3
        assert "crashes" in m["last_error"] and "SIGKILL" in m["last_error"], m["last_error"]
        assert "internal error" not in m["last_error"], m["last_error"]
        assert "internal error" not in svc.stderr_text()


def _health_detection_bound(interval: float, failures: int) -> float:
    """The documented bound (docs/supervision.md, "Hung children"): no answer for ``interval × failures``."""
    return failures * interval


def test_sigstopped_child_is_replaced(two_models: Path, tmp_path: Path, llama_server_bin: Path) -> None:
    """A real SIGSTOP: the hang is detected within the documented bound, and the model is ready
    again on a new child within that bound + the first restart backoff + the new child's start."""
    interval, failures, backoff = 0.5, 2, 0.2  # FAST
    slack = 3.0  # scheduling on a loaded 2-core box (1.5 s was exceeded once in a full run); the bound is 1 s
    with running_service(two_models, tmp_path / "state", llama_server_bin) as svc:
        pid = svc.model("tiny")["pid"]
        events: list[dict[str, object]] = []
        watcher = ServiceClient(svc.url)
        follower = threading.Thread(target=lambda: events.extend(watcher.events()), daemon=True)
        follower.start()
        try:
            wait_for(lambda: svc.model("tiny")["state"] == "ready", what="subscribed")
            stopped_at = time.time()
            os.kill(pid, signal.SIGSTOP)  # fault injection: a hung child
            m = wait_for(
                # A new child, ready: not the old one's row between its death and the crash
                # handling (ready still, but no pid: that passed as "replaced" once under load).
                lambda: (s := svc.model("tiny"))["state"] == "ready" and s["pid"] not in (None, pid) and s,
                timeout=30,
                what="replaced",
            )
        finally:
            watcher.close()
            follower.join(timeout=10)
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        assert m["restarts"] >= 1
        mine = [e for e in events if e.get("model") == "tiny" and float(str(e["time"])) >= stopped_at]
        hang = next(e for e in mine if e["kind"] == "hang")
        detected = float(str(hang["time"])) - stopped_at
        assert detected <= _health_detection_bound(interval, failures) + slack, detected
        # Killed and restarted right after detection: what remains is the backoff and the new
        # child's own start, which the service reports as the model's load time.
        restart = next(e for e in mine if e["kind"] == "restart")
        assert float(str(restart["time"])) - stopped_at <= _health_detection_bound(interval, failures) + slack
        assert restart["data"] == {**restart["data"], "backoff": backoff}  # type: ignore[dict-item]


def test_supervisor_sigkill_leaves_no_llama_server(
    two_models: Path, tmp_path: Path, llama_server_bin: Path
) -> None:
    with running_service(two_models, tmp_path / "state", llama_server_bin) as svc:
        with svc.client() as c:
            assert c.post("/api/models/tinyb/load").status_code == 200
        kids = svc.llama_children()
        assert len(kids) == 2
        svc.proc.kill()
        svc.proc.wait()
        _gone, alive = psutil.wait_procs(kids, timeout=3)
        assert not alive, f"orphans: {[p.pid for p in alive]}"


def test_queue_full_gives_429(tmp_path: Path, gemma_path: Path, llama_server_bin: Path) -> None:
    # gemma, so that a request really holds the only slot for a while.
    cfg = write_config(
        tmp_path / "forge.toml",
        FAST + model_section("slow", gemma_path, preload=True, parallel=1, max_concurrency=1, queue=1),
    )
    with running_service(cfg, tmp_path / "state", llama_server_bin) as svc:
        # ignore_eos and a budget longer than the test: the slot stays held until the test lets go
        # (a fast machine finished a 120-token story before the 429 was asked for).
        long = {
            "model": "slow",
            "prompt": "Tell a long story.",
            "max_tokens": 900,
            "stream": True,
            "ignore_eos": True,
        }
        started = threading.Event()
        release = threading.Event()
        results: list[int] = []

        def hold() -> None:
            with (
                httpx.Client(base_url=svc.url, timeout=120) as c,
                c.stream("POST", "/v1/completions", json=long) as r,
            ):
                results.append(r.status_code)
                for _ in r.iter_lines():
                    started.set()
                    if release.is_set():
                        break  # closing the stream gives the slot back

        first = threading.Thread(target=hold)
        first.start()
        waiter = threading.Thread(target=hold)  # takes the one queue place
        try:
            assert started.wait(60)
            waiter.start()
            wait_for(lambda: svc.model("slow")["waiting"] == 1, what="one waiting")
            with svc.client() as c:
                r = c.post("/v1/completions", json={"model": "slow", "prompt": "x", "max_tokens": 1})
            assert r.status_code == 429
            assert r.headers["retry-after"] == "1"
            assert r.json()["error"]["code"] == "queue_full"
        finally:
            release.set()
            for t in (first, waiter):
                if t.is_alive() or t.ident is not None:
                    t.join(120)
        assert results == [200, 200]


def test_auth_and_traversal(tmp_path: Path, tiny_gguf: Path, llama_server_bin: Path) -> None:
    models = tmp_path / "models"
    models.mkdir()
    shutil.copy(tiny_gguf, models / "extra.gguf")
    secret = tmp_path / "secret.gguf"
    shutil.copy(tiny_gguf, secret)
    cfg = write_config(
        tmp_path / "forge.toml",
        f'[server]\napi_key = "s3cret"\nmodel_dirs = ["{models}"]\n'
        + FAST
        + model_section("tiny", tiny_gguf),
    )
    with running_service(cfg, tmp_path / "state", llama_server_bin, api_key="s3cret") as svc:
        with httpx.Client(base_url=svc.url, timeout=30) as anon:
            assert anon.get("/health").status_code == 200
            r = anon.get("/v1/models")
            assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
            assert anon.get("/v1/models", headers={"Authorization": "Bearer wrong"}).status_code == 401
        with svc.client() as c:
            assert c.get("/v1/models").status_code == 200
            bad = c.post("/api/models", json={"name": "x", "path": str(models / ".." / "secret.gguf")})
            assert bad.status_code == 400 and "model directory" in bad.json()["error"]["message"]
            ok = c.post("/api/models", json={"name": "extra", "path": str(models / "extra.gguf")})
            assert ok.status_code == 200 and ok.json()["state"] == "ready"
            big = c.post(
                "/v1/completions", content=b"x" * (17 * 2**20), headers={"Content-Type": "application/json"}
            )
            assert big.status_code == 413

            def chunked_body() -> Iterator[bytes]:  # no Content-Length: counted while read, the same 413
                for _ in range(17):
                    yield b"x" * 2**20

            chunked = c.post(
                "/v1/completions", content=chunked_body(), headers={"Content-Type": "application/json"}
            )
            assert chunked.status_code == 413, chunked.text
            assert chunked.json()["error"]["code"] == "request_too_large"
            assert chunked.headers["x-request-id"]


def test_sighup_reload_keeps_running_models_and_in_flight_requests(
    tmp_path: Path, tiny_gguf: Path, gemma_path: Path, llama_server_bin: Path
) -> None:
    other = tmp_path / "tiny-b.gguf"
    shutil.copy(tiny_gguf, other)
    cfg = write_config(
        tmp_path / "forge.toml",
        FAST + model_section("slow", gemma_path, preload=True) + model_section("tinyb", other, ctx_size=512),
    )
    with running_service(cfg, tmp_path / "state", llama_server_bin) as svc:
        pid_before = svc.model("slow")["pid"]
        done: list[str] = []

        def stream() -> None:
            body = {"model": "slow", "prompt": "Tell a story.", "max_tokens": 100, "stream": True}
            with (
                httpx.Client(base_url=svc.url, timeout=120) as c,
                c.stream("POST", "/v1/completions", json=body) as r,
            ):
                done.extend(line for line in r.iter_lines() if line.startswith("data: "))

        t = threading.Thread(target=stream)
        t.start()
        wait_for(lambda: svc.model("slow")["in_flight"] == 1, what="in flight")
        third = tmp_path / "tiny-c.gguf"
        shutil.copy(tiny_gguf, third)
        text = cfg.read_text().replace("preload = true", "preload = true\nttl = 600")
        text = text.replace("[models.tinyb]", "[models.gone]") + model_section("tinyc", third, preload=True)
        cfg.write_text(text)
        svc.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: "tinyc" in svc.models() and svc.model("tinyc")["state"] == "ready", what="reloaded")
        t.join(120)
        assert done[-1] == "data: [DONE]", done[-3:]
        models = svc.models()
        assert models["slow"]["pid"] == pid_before  # unchanged (ttl only): not restarted
        assert set(models) == {"slow", "gone", "tinyc"}

        # A bad reload keeps the old config running.
        cfg.write_text(text + "\n[models.bad]\nctx_size = -1\n")
        with svc.client() as c:
            r = c.post("/api/reload")
        assert r.status_code == 400 and "models.bad" in r.json()["error"]["message"]
        assert svc.model("slow")["pid"] == pid_before


def test_sd_notify_protocol(two_models: Path, tmp_path: Path, llama_server_bin: Path) -> None:
    sock_path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(sock_path))
    sock.settimeout(30)
    received: list[str] = []

    def until(pred: str) -> None:
        while not any(pred in m for m in received):
            received.append(sock.recv(4096).decode())

    try:
        env = {"NOTIFY_SOCKET": str(sock_path), "WATCHDOG_USEC": "400000"}
        with running_service(two_models, tmp_path / "state", llama_server_bin, extra_env=env) as svc:
            until("READY=1")
            assert any("STATUS=" in m for m in received)
            until("WATCHDOG=1")
            received.clear()
            svc.proc.send_signal(signal.SIGHUP)
            until("RELOADING=1")
            until("READY=1")
            assert any("MONOTONIC_USEC=" in m for m in received)
            svc.proc.send_signal(signal.SIGTERM)
            until("STOPPING=1")
            assert svc.proc.wait(30) == 0
    finally:
        sock.close()


@pytest.mark.parametrize(
    ("toml", "needle"),
    [
        ("[models.a]\npath = 'x.gguf'\nctx_size = -5\n", "models.a.ctx_size"),
        ("[server]\nhost = '0.0.0.0'\n", "api_key"),
        ("[serverr]\nport = 1\n", "serverr"),
    ],
)
def test_bad_config_refused_at_start(tmp_path: Path, toml: str, needle: str, llama_server_bin: Path) -> None:
    cfg = write_config(tmp_path / "bad.toml", toml)
    env = dict(os.environ, FORGE_STATE_DIR=str(tmp_path / "state"), FORGE_LLAMA_SERVER=str(llama_server_bin))
    r = subprocess.run(
        [*FORGE, "serve", "--config", str(cfg)], capture_output=True, text=True, env=env, timeout=60
    )
    assert r.returncode == 2
    assert needle in r.stderr
    assert "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) <= 3


def test_check_config_validates_without_serving(tmp_path: Path, tiny_gguf: Path) -> None:
    """`--check-config`: exit 0 and a count; a local model file that is not there yet, or a GGUF
    cut short (a copy still under way), is a note (a volume may bring it before the first load),
    a bad value is exit 2 naming the key."""
    env = dict(os.environ, FORGE_STATE_DIR=str(tmp_path / "state"))
    missing = tmp_path / "later.gguf"
    cut = tmp_path / "cut.gguf"
    whole = tiny_gguf.read_bytes()
    cut.write_bytes(whole[: len(whole) // 2])
    cfg = write_config(
        tmp_path / "forge.toml",
        model_section("here", tiny_gguf)
        + model_section("later", missing)
        + model_section("cut", cut)
        + model_section("demo", Path("smollm2-135m")),
    )
    r = subprocess.run(
        [*FORGE, "serve", "--check-config", "--config", str(cfg)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert "config OK" in r.stderr and "(4 models)" in r.stderr
    notes = [line for line in r.stderr.splitlines() if line.startswith("note:")]
    assert len(notes) == 2, notes
    assert notes[0] == f"note: models.later: no file at {missing} yet (it must exist when the model loads)"
    assert notes[1].startswith(f"note: models.cut: {cut} is truncated") and "download" in notes[1], notes
    assert not (tmp_path / "state" / "service.json").exists()  # nothing was served
    bad = write_config(tmp_path / "bad.toml", model_section("x", tiny_gguf, workers="sometimes"))
    r = subprocess.run(
        [*FORGE, "serve", "--check-config", "--config", str(bad)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert r.returncode == 2 and "models.x.workers" in r.stderr and "Traceback" not in r.stderr


def test_a_misspelt_embedded_name_is_a_config_error(tmp_path: Path, tiny_gguf: Path) -> None:
    """`path = "smolm2-135m"` can only mean an embedded model: --check-config (and serve) say so
    with "did you mean", exit 2, one line naming every such model — not a note and exit 0."""
    env = dict(os.environ, FORGE_STATE_DIR=str(tmp_path / "state"))
    cfg = write_config(
        tmp_path / "forge.toml",
        model_section("chat", Path("smolm2-135m"))
        + model_section("here", tiny_gguf)
        + model_section("base", Path("gemma-3-207m")),
    )
    for args in (["--check-config"], ["--port", "0"]):
        r = subprocess.run(
            [*FORGE, "serve", *args, "--config", str(cfg)],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        assert r.returncode == 2, (r.stdout, r.stderr)
        (line,) = r.stderr.strip().splitlines()
        assert line.startswith(
            "error: config forge.toml: models.chat.path: 'smolm2-135m' is not an embedded"
        ), line
        assert "did you mean 'smollm2-135m'?" in line and "models.base.path" in line
        assert "did you mean 'gemma-3-270m'?" in line and "Traceback" not in line
    assert not (tmp_path / "state" / "service.json").exists()  # nothing was served


def test_forge_ps_and_unload_talk_to_the_service(
    two_models: Path, tmp_path: Path, llama_server_bin: Path
) -> None:
    with running_service(two_models, tmp_path / "state", llama_server_bin) as svc:
        env = dict(os.environ, FORGE_STATE_DIR=str(svc.state_dir))
        out = subprocess.run([*FORGE, "ps", "--json"], capture_output=True, text=True, env=env, timeout=60)
        assert out.returncode == 0, out.stderr
        rows = {r["name"]: r for r in json.loads(out.stdout)["models"]}
        assert rows["tiny"]["state"] == "ready" and rows["tiny"]["devices"] == ["cpu"]
        assert "estimated_bytes" in rows["tiny"]["memory"]
        r = subprocess.run([*FORGE, "unload", "tiny"], capture_output=True, text=True, env=env, timeout=60)
        assert r.returncode == 0, r.stderr
        assert svc.model("tiny")["state"] == "stopped"
        r = subprocess.run([*FORGE, "load", "tiny"], capture_output=True, text=True, env=env, timeout=60)
        assert r.returncode == 0, r.stderr
        assert svc.model("tiny")["state"] == "ready"
        r = subprocess.run(
            [*FORGE, "logs", "tiny", "-n", "5"], capture_output=True, text=True, env=env, timeout=60
        )
        assert r.returncode == 0 and r.stdout.strip()


def test_a_second_service_on_the_same_state_dir_is_refused(
    two_models: Path, tmp_path: Path, llama_server_bin: Path
) -> None:
    """Two real `forge serve`s on one state dir: the second refuses at once, naming the first's pid,
    and leaves the first one's bookkeeping as it was (issue 19, 2: it used to start, and at its
    exit `forge ps` lost the first service and children.json was emptied under its children)."""
    with running_service(two_models, tmp_path / "state", llama_server_bin) as svc:
        ledger = svc.state_dir / "children.json"
        info = svc.state_dir / "service.json"
        before = (ledger.read_text(), info.read_text())
        children = [r["pid"] for r in json.loads(before[0])]
        assert children and json.loads(before[1])["pid"] == svc.proc.pid
        env = dict(os.environ, FORGE_STATE_DIR=str(svc.state_dir), FORGE_LLAMA_SERVER=str(llama_server_bin))
        env.pop("NOTIFY_SOCKET", None)
        second = subprocess.run(
            [*FORGE, "serve", "--config", str(two_models), "--port", "0"],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        assert second.returncode == 1, second.stderr
        line = second.stderr.strip()
        assert f"pid {svc.proc.pid}" in line and str(svc.state_dir) in line and "FORGE_STATE_DIR" in line, (
            line
        )
        assert "Traceback" not in second.stderr and not second.stdout.strip()  # it never listened
        assert (ledger.read_text(), info.read_text()) == before
        assert sorted(p.pid for p in svc.llama_children()) == sorted(children)
        ps = subprocess.run([*FORGE, "ps", "--json"], capture_output=True, text=True, env=env, timeout=60)
        assert ps.returncode == 0 and json.loads(ps.stdout)["models"], ps.stderr
    # The lock dies with its holder: the same state dir serves again at once.
    with running_service(two_models, tmp_path / "state", llama_server_bin) as svc:
        assert json.loads((svc.state_dir / "service.json").read_text())["pid"] == svc.proc.pid


def test_sys_executable_runs_forge() -> None:
    r = subprocess.run([*FORGE, "--version"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and "llama.cpp 4df29be" in r.stdout
    _ = sys


def test_unload_while_loading_returns_and_leaves_nothing(
    tmp_path: Path, gemma_path: Path, llama_server_bin: Path
) -> None:
    cfg = write_config(tmp_path / "forge.toml", FAST + model_section("slow", gemma_path, preload=True))
    with running_service(cfg, tmp_path / "state", llama_server_bin, wait_ready=False) as svc:
        wait_for(lambda: svc.model("slow")["state"] == "loading", what="loading")
        with svc.client() as c:
            r = c.post("/api/models/slow/unload", timeout=30)
        assert r.status_code == 200, r.text
        assert r.json()["state"] == "stopped"
        assert svc.model("slow")["state"] == "stopped"
        assert svc.llama_children() == []
        assert "crash" not in (svc.model("slow")["last_error"] or "")


def test_browser_origin_and_bad_names_are_refused(
    two_models: Path, tmp_path: Path, llama_server_bin: Path
) -> None:
    with running_service(two_models, tmp_path / "state", llama_server_bin) as svc, svc.client() as c:
        evil = c.post("/api/models/tiny/unload", headers={"Origin": "http://evil.example"})
        assert evil.status_code == 403 and evil.json()["error"]["code"] == "forbidden_origin"
        assert svc.model("tiny")["state"] == "ready"
        local = c.post("/api/models/tinyb/unload", headers={"Origin": "http://localhost:5173"})
        assert local.status_code == 200
        bad = c.post("/api/models", json={"name": "../../x", "path": "/tmp/x.gguf"})
        assert bad.status_code == 400 and "not valid" in bad.json()["error"]["message"]
