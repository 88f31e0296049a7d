"""`forge reload` and SIGHUP on a real `forge serve`: the ``[server]`` keys it can apply live apply
(seen from outside: ``/metrics`` without a key, a CORS preflight, the log's format, the activity
log), and a key only a restart applies is named — in the CLI's summary, a warning in the service
log and a ``restart_required`` event — never ignored without a word. The children are the FAKE
llama-server (``FORGE_LLAMA_SERVER``): no model is loaded here."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import httpx

from tests.support.service import FORGE, Service, running_service, wait_for, write_config

MODEL = '[models.m]\npath = "{path}"\n'
APP = "https://app.example"
PREFLIGHT = {"Origin": APP, "Access-Control-Request-Method": "POST"}
RESTART_LINE = "server.context_dir changed: restart forge serve to apply"


def _restart_events(svc: Service, want: int) -> list[dict[str, Any]]:
    """The first ``want`` ``restart_required`` events of the history (``/api/events?replay=1``);
    a read timeout (the history holds fewer: the stream waits for new ones) fails the test."""
    out: list[dict[str, Any]] = []
    with svc.client() as c, c.stream("GET", "/api/events?replay=1", timeout=10) as r:
        for line in r.iter_lines():
            if (
                line.startswith("data: ")
                and (ev := json.loads(line[len("data: ") :]))["kind"] == "restart_required"
            ):
                out.append(ev)
                if len(out) == want:
                    return out
    raise AssertionError(f"the event stream ended after {out}")


def test_sighup_applies_the_live_server_keys(tmp_path: Path, tiny_gguf: Path, fake_bin: Path) -> None:
    before = '[server]\napi_key = "k"\nlog_format = "text"\nactivity = false\n'
    after = f'[server]\napi_key = "k"\nlog_format = "json"\nactivity = true\nmetrics_public = true\ncors_origins = ["{APP}"]\n'
    config = write_config(tmp_path / "forge.toml", before + MODEL.format(path=tiny_gguf))
    with running_service(config, tmp_path / "state", fake_bin, api_key="k") as svc:
        assert httpx.get(f"{svc.url}/metrics", timeout=10).status_code == 401
        with svc.client() as c:
            assert c.get("/api/activity").status_code == 503
            assert (
                "access-control-allow-origin"
                not in c.options("/v1/chat/completions", headers=PREFLIGHT).headers
            )
        write_config(config, after + MODEL.format(path=tiny_gguf))
        svc.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: "config reloaded" in svc.stderr_text(), timeout=30, what="the SIGHUP reload")
        assert httpx.get(f"{svc.url}/metrics", timeout=10).status_code == 200  # metrics_public: no key
        with svc.client() as c:
            pre = c.options("/v1/chat/completions", headers=PREFLIGHT)
            assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == APP, pre.headers
            assert c.get("/api/activity").status_code == 200
        # The reload's own lines are in the new format: one JSON object per line.
        [line] = [x for x in svc.stderr_text().splitlines() if "config reloaded" in x]
        assert json.loads(line)["message"].startswith("config reloaded"), line
        # Logged before "config reloaded" reached the file, had a key needed a restart.
        assert "restart forge serve" not in svc.stderr_text()


def test_reload_and_sighup_name_what_needs_a_restart(tmp_path: Path, tiny_gguf: Path, fake_bin: Path) -> None:
    before = f'[server]\ncontext_dir = "{tmp_path / "ctx-a"}"\n'
    after = f'[server]\ncontext_dir = "{tmp_path / "ctx-b"}"\n'
    config = write_config(tmp_path / "forge.toml", before + MODEL.format(path=tiny_gguf))
    with running_service(config, tmp_path / "state", fake_bin) as svc:
        env = dict(os.environ, FORGE_STATE_DIR=str(svc.state_dir))
        write_config(config, after + MODEL.format(path=tiny_gguf))
        r = subprocess.run([*FORGE, "reload"], capture_output=True, text=True, env=env, timeout=60)
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == (
            "config reloaded: 0 changed, 0 added, 0 removed, 1 unchanged; "
            "server.context_dir: applied at the next restart of forge serve"
        )
        svc.proc.send_signal(signal.SIGHUP)
        wait_for(
            lambda: svc.stderr_text().count(RESTART_LINE) == 2,
            timeout=30,
            what="the SIGHUP reload's warning",
        )
        events = _restart_events(svc, 2)
        assert all(e["model"] == "*" and e["data"]["keys"] == ["server.context_dir"] for e in events), events
