"""A reload and the ``[server]`` settings: every key the service can apply while it runs applies
from the next request on (``metrics_public``, ``max_body_bytes``, ``audio_max_bytes``,
``cors_origins``, ``sse_keepalive``, ``keep_alive_streams``, ``allow_remote_media``,
``context_max_bytes``, ``activity``, ``activity_keep_days``…); those only a restart applies (the
sockets, the TLS files, the directories) are named in the reload's answer as
``restart_required`` and in a ``restart_required`` event, never silently ignored. The reload here
is the one SIGHUP runs (``_reloader``), through ``POST /api/reload``."""

from __future__ import annotations

import pytest

from rocmforge_supervisor.supervisor import EventKind
from tests.gateway_fast.conftest import Serve
from tests.gateway_fast.dialects import chat

pytestmark = pytest.mark.anyio

ROOT = {"Authorization": "Bearer root-secret"}
KEYS = [{"name": "root", "key": "root-secret", "admin": True}]
APP = "https://app.example"
#: A browser's preflight from APP's page: answered (CORS headers) only while APP is listed.
PREFLIGHT = {
    "Origin": APP,
    "Access-Control-Request-Method": "POST",
    "Access-Control-Request-Headers": "content-type",
}


async def test_live_server_settings_apply_and_the_others_are_named_restart_required(serve: Serve) -> None:
    before = {"keys": KEYS, "sse_keepalive": 0}
    after = {
        **before,
        "metrics_public": True,
        "max_body_bytes": 2000,
        "audio_max_bytes": 1000,
        "cors_origins": [APP],
        "sse_keepalive": 0.1,
        "keep_alive_streams": True,
        "allow_remote_media": True,
        "context_max_bytes": 12345,
        "activity_keep_days": 2,
        "activity_max_rows": 77,
        "capture_max_bytes": 99,
        "port": 18080,
        "metrics_host": "127.0.0.2",
    }
    models = {"m": {"preload": True, "args": ["--fake-first-token-delay", "0.35"]}}
    audio = {"Content-Type": "multipart/form-data; boundary=x", **ROOT}
    upload = b"x" * (1536 * 1024)  # over audio_max_bytes = 1000 (+ 1 MiB for the form), under 25 MiB
    async with serve(models, server=before, reload_server=after) as gw:
        path, body = chat("openai", "m", stream=True)
        assert (await gw.client.get("/metrics")).status_code == 401
        first = await gw.client.post(path, json=body, headers=ROOT)
        assert first.status_code == 200 and b"keep-alive" not in first.content
        assert first.headers["connection"] == "close"  # keep_alive_streams' default
        pre = await gw.client.options(path, headers=PREFLIGHT)
        assert "access-control-allow-origin" not in pre.headers, pre.headers
        sized = await gw.client.post("/v1/audio/transcriptions", content=upload, headers=audio)
        assert sized.status_code != 413, sized.text

        r = await gw.client.post("/api/reload", headers=ROOT)
        assert r.status_code == 200, r.text
        assert r.json()["unchanged"] == ["m"]
        assert r.json()["restart_required"] == ["server.port", "server.metrics_host"]
        [event] = [e for e in gw.sup.events.history() if e.kind == EventKind.RESTART_REQUIRED]
        assert event.model == "*" and event.data["keys"] == ["server.port", "server.metrics_host"]
        assert "restart forge serve" in event.data["message"]

        assert (await gw.client.get("/metrics")).status_code == 200  # metrics_public, no key
        big = {**body, "messages": [{"role": "user", "content": "x" * 3000}]}
        too_big = await gw.client.post(path, json=big, headers=ROOT)
        assert too_big.status_code == 413 and "2000" in too_big.json()["error"]["message"]
        sized = await gw.client.post("/v1/audio/transcriptions", content=upload, headers=audio)
        assert sized.status_code == 413 and str(1000 + 1024 * 1024) in sized.text, sized.text
        pre = await gw.client.options(path, headers=PREFLIGHT)
        assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == APP, pre.headers
        late = await gw.client.post(path, json=body, headers=ROOT)
        assert late.status_code == 200 and late.content.startswith(b": keep-alive\n\n")
        assert late.headers.get("connection") != "close"
        # No HTTP answer shows these cheaply: the values the next request and the next save read.
        assert gw.state.server.allow_remote_media is True
        assert gw.sup.context_store.max_bytes == 12345
        store = gw.state.recorder.store
        assert store is not None and (store.keep_days, store.max_rows, store.capture_max_bytes) == (2, 77, 99)
        assert gw.state.recorder.capture_max_bytes == 99

        # Still pending at the next reload: the service still listens where it started.
        again = await gw.client.post("/api/reload", headers=ROOT)
        assert again.json()["restart_required"] == ["server.port", "server.metrics_host"]


async def test_a_reload_that_changes_no_restart_only_setting_says_nothing_of_a_restart(serve: Serve) -> None:
    async with serve({"m": {}}, server={"load_wait": 5}, reload_server={"load_wait": 1}) as gw:
        r = await gw.client.post("/api/reload")
        assert r.status_code == 200 and "restart_required" not in r.json(), r.json()
        assert gw.sup.config.server.load_wait == 1
        assert not [e for e in gw.sup.events.history() if e.kind == EventKind.RESTART_REQUIRED]


@pytest.mark.parametrize(("before", "after"), [(True, False), (False, True)])
async def test_a_reload_turns_the_activity_log_on_and_off(serve: Serve, before: bool, after: bool) -> None:
    async with serve({"m": {}}, server={"activity": before}, reload_server={"activity": after}) as gw:
        assert (await gw.client.get("/api/activity")).status_code == (200 if before else 503)
        assert (await gw.client.post("/api/reload")).status_code == 200
        listed = await gw.client.get("/api/activity")
        assert listed.status_code == (200 if after else 503), listed.text
        if after:  # recorded from now on
            path, body = chat("openai", "m", stream=False)
            assert (await gw.client.post(path, json=body)).status_code == 200
            rows = (await gw.client.get("/api/activity")).json()["activity"]
            assert [r["route"] for r in rows] == [path]
        else:
            assert "activity log is off" in listed.json()["error"]["message"]
