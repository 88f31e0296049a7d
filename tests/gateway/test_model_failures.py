"""What a model's failure and recovery look like from outside, through a real `forge serve`: the
status a failed model answers (one the SDKs do not retry), the memory a stopped model reports, and
the error a recovered model no longer shows. Real service, real llama-server, the real SDKs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import anthropic
import httpx
import httpx2
import openai
import pytest

from tests.support.service import FORGE, Service, model_section, running_service, wait_for, write_config

SUPERVISOR = """
[supervisor]
restart_backoff_initial = 0.2
restart_backoff_max = 2.0
health_interval = 0.5
health_failures = 2
stop_timeout = 5
"""


@pytest.fixture
def svc(tmp_path: Path, tiny_gguf: Path, llama_server_bin: Path) -> Iterator[Service]:
    """A service per test: each one starts or kills children, and ``no_orphans`` checks per test."""
    cfg = write_config(
        tmp_path / "forge.toml",
        SUPERVISOR
        + model_section("tiny", tiny_gguf, preload=True)
        + model_section("gone", tmp_path / "gone.gguf"),
    )
    with running_service(cfg, tmp_path / "state", llama_server_bin) as s:
        wait_for(lambda: s.model("tiny")["state"] == "ready", timeout=120, what="tiny ready")
        yield s


def _counting(sent: list[str]) -> httpx.Client:
    """An httpx client for the openai SDK that records every request it sends (retries included)."""
    return httpx.Client(event_hooks={"request": [lambda r: sent.append(r.url.path)]}, timeout=60)


def _counting2(sent: list[str]) -> httpx2.Client:
    """The same for the anthropic SDK, which is built on httpx2."""
    return httpx2.Client(event_hooks={"request": [lambda r: sent.append(r.url.path)]}, timeout=60)


def test_a_missing_file_is_a_failure_the_sdks_do_not_retry(svc: Service, closing: ExitStack) -> None:
    """A model whose file is missing failed for good (until `forge load` or a reload): a 503 said
    "in a moment", and every SDK retried it. Now a 500 with X-Should-Retry: false, which the
    openai and anthropic SDKs obey: one request each, with max_retries=3."""
    sent: list[str] = []
    oai = closing.enter_context(
        openai.OpenAI(
            base_url=f"{svc.url}/v1",
            api_key="x",
            max_retries=3,
            http_client=closing.enter_context(_counting(sent)),
        )
    )
    with pytest.raises(openai.InternalServerError) as e:
        oai.chat.completions.create(model="gone", messages=[{"role": "user", "content": "Hi"}], max_tokens=2)
    assert sent == ["/v1/chat/completions"], sent
    assert e.value.response.headers["x-should-retry"] == "false"
    body = e.value.body
    assert isinstance(body, dict) and body["code"] == "file_not_found", body
    assert "model 'gone' failed: no model file at" in body["message"] and "forge load gone" in body["message"]
    assert svc.model("gone")["state"] == "failed" and svc.model("gone")["failure_kind"] == "file_not_found"

    sent.clear()
    ant = closing.enter_context(
        anthropic.Anthropic(
            base_url=svc.url, api_key="x", max_retries=3, http_client=closing.enter_context(_counting2(sent))
        )
    )
    with pytest.raises(anthropic.InternalServerError) as a:
        ant.messages.create(model="gone", max_tokens=2, messages=[{"role": "user", "content": "Hi"}])
    assert sent == ["/v1/messages"], sent
    assert isinstance(a.value.body, dict) and a.value.body["type"] == "error"


def test_a_stopped_model_reports_no_memory(svc: Service) -> None:
    """`forge ps` showed the last child's estimate and allocation for a stopped model."""
    mem = svc.model("tiny")["memory"]
    assert sum(mem["estimated_bytes"].values()) > 0 and mem["actual_bytes"], mem
    env = dict(os.environ, FORGE_STATE_DIR=str(svc.state_dir))
    r = subprocess.run([*FORGE, "unload", "tiny"], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([*FORGE, "ps", "--json"], capture_output=True, text=True, env=env, timeout=60)
    row = next(m for m in json.loads(r.stdout)["models"] if m["name"] == "tiny")
    assert row["state"] == "stopped"
    assert row["memory"] == {"estimated_bytes": {}, "actual_bytes": {}}, row
    with httpx.Client(base_url=svc.url, timeout=60) as c:
        assert c.post("/api/models/tiny/load").json()["state"] == "ready"  # as the module found it
    assert svc.model("tiny")["memory"]["actual_bytes"]


def test_a_recovered_model_shows_no_error(svc: Service) -> None:
    """A child killed (an OOM killer) and replaced: once ready again, `last_error` is empty (it
    kept the crash); the crash is in `last_crash`."""
    old = wait_for(lambda: (m := svc.model("tiny"))["state"] == "ready" and m["pid"], what="ready")
    os.kill(old, signal.SIGKILL)  # fault injection
    wait_for(lambda: svc.model("tiny")["last_error"], timeout=30, what="the crash to be seen")
    m = wait_for(
        lambda: (s := svc.model("tiny"))["state"] == "ready" and s["pid"] not in (None, old) and s,
        timeout=60,
        what="a new child",
    )
    assert m["restarts"] >= 1 and m["last_error"] is None, m
    assert "SIGKILL" in (m["last_crash"] or ""), m
