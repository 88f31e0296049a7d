"""A reload and the ``[server]`` settings: those the gateway reads per request apply from the next
request on (``metrics_public``, ``max_body_bytes``, ``sse_keepalive``, ``keep_alive_streams``, ``allow_remote_media``,
``context_max_bytes``, ``activity_keep_days``…); those read once at start (the sockets, the log
format…) are named in the reload's answer as ``restart_required``, never silently ignored."""

from __future__ import annotations

import pytest

from tests.gateway_fast.conftest import Serve
from tests.gateway_fast.dialects import chat

pytestmark = pytest.mark.anyio

ROOT = {"Authorization": "Bearer root-secret"}
KEYS = [{"name": "root", "key": "root-secret", "admin": True}]


async def test_live_server_settings_apply_and_the_others_are_named_restart_required(serve: Serve) -> None:
    before = {"keys": KEYS, "sse_keepalive": 0}
    after = {
        **before,
        "metrics_public": True,
        "max_body_bytes": 2000,
        "sse_keepalive": 0.1,
        "keep_alive_streams": True,
        "allow_remote_media": True,
        "context_max_bytes": 12345,
        "activity_keep_days": 2,
        "port": 18080,
        "log_format": "json",
    }
    models = {"m": {"preload": True, "args": ["--fake-first-token-delay", "0.35"]}}
    async with serve(models, server=before, reload_server=after) as gw:
        path, body = chat("openai", "m", stream=True)
        assert (await gw.client.get("/metrics")).status_code == 401
        first = await gw.client.post(path, json=body, headers=ROOT)
        assert first.status_code == 200 and b"keep-alive" not in first.content
        assert first.headers["connection"] == "close"  # keep_alive_streams' default

        r = await gw.client.post("/api/reload", headers=ROOT)
        assert r.status_code == 200, r.text
        assert r.json()["unchanged"] == ["m"]
        assert r.json()["restart_required"] == ["server.port", "server.log_format"]

        assert (await gw.client.get("/metrics")).status_code == 200  # metrics_public, no key
        big = {**body, "messages": [{"role": "user", "content": "x" * 3000}]}
        too_big = await gw.client.post(path, json=big, headers=ROOT)
        assert too_big.status_code == 413 and "2000" in too_big.json()["error"]["message"]
        late = await gw.client.post(path, json=body, headers=ROOT)
        assert late.status_code == 200 and late.content.startswith(b": keep-alive\n\n")
        assert late.headers.get("connection") != "close"
        # No HTTP answer shows these cheaply: the values the next request and the next save read.
        assert gw.state.allow_remote_media is True
        assert gw.sup.context_store.max_bytes == 12345
        assert gw.state.recorder.store is not None and gw.state.recorder.store.keep_days == 2

        # Still pending at the next reload: the service still listens where it started.
        again = await gw.client.post("/api/reload", headers=ROOT)
        assert again.json()["restart_required"] == ["server.port", "server.log_format"]


async def test_a_reload_that_changes_no_restart_only_setting_says_nothing_of_a_restart(serve: Serve) -> None:
    async with serve({"m": {}}, server={"load_wait": 5}, reload_server={"load_wait": 1}) as gw:
        r = await gw.client.post("/api/reload")
        assert r.status_code == 200 and "restart_required" not in r.json(), r.json()
        assert gw.sup.config.server.load_wait == 1
