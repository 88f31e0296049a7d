"""A load the residency rules refuse is a 409 at once, in each dialect's own error shape, with a
header that stops the official SDKs from retrying it; the control API's load says the same.
Against the FAKE llama-server (the rule here is a group's ``max_loaded`` held by a pinned member)."""

from __future__ import annotations

import time

import pytest

from tests.gateway_fast.conftest import Serve
from tests.gateway_fast.dialects import DIALECTS, Dialect, chat, error_of

pytestmark = pytest.mark.anyio

MODELS = {"big": {"pinned": True, "preload": True}, "small": {}}
GROUPS = {"chat": {"members": ["big", "small"], "max_loaded": 1}}


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("stream", [False, True])
async def test_a_refused_load_is_a_409_in_the_dialects_shape_within_a_second(
    serve: Serve, dialect: Dialect, stream: bool
) -> None:
    async with serve(MODELS, groups=GROUPS) as gw:
        path, body = chat(dialect, "small", stream=stream)
        started = time.monotonic()
        r = await gw.client.post(path, json=body)
        assert time.monotonic() - started < 1.0
        assert r.status_code == 409, r.text
        assert r.headers["x-should-retry"] == "false"
        message, kind = error_of(dialect, r.json())
        assert "max_loaded = 1" in message and "big (pinned)" in message and "forge unload" in message
        assert kind in (None, "invalid_request_error")
        assert gw.model("big").status().pid is not None  # the pinned one was not touched


async def test_the_control_apis_load_is_a_409_too_and_models_show_the_rules(serve: Serve) -> None:
    async with serve(MODELS, groups=GROUPS) as gw:
        r = await gw.client.post("/api/models/small/load")
        assert r.status_code == 409 and "max_loaded" in r.json()["error"]["message"], r.text
        rows = {m["name"]: m for m in (await gw.client.get("/api/models")).json()["models"]}
        assert rows["big"]["residency"] == {
            "pinned": True,
            "swap": "auto",
            "evict_cost": 1.0,
            "group": "chat",
            "default": False,
        }
        assert rows["small"]["state"] == "stopped" and rows["small"]["failure_kind"] is None
