"""``backend = "command"`` models at the gateway: memory is made for them as for any model (the idle
neighbour is evicted, the request answered), and a load the residency rules forbid is the same 409
a llama model gets, not a 500 that marks the model failed. The command is the FAKE llama-server
run through ``cmd``; every model sits on the rx7900xtx fixture's GPU (24 GiB: two fit, not three).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from rocmforge_supervisor.supervisor import EventKind
from tests.gateway_fast.conftest import Serve
from tests.gateway_fast.dialects import chat, error_of

pytestmark = pytest.mark.anyio


def _command(fake_bin: Path, **keys: Any) -> dict[str, Any]:
    cmd = [str(fake_bin), "--host", "${HOST}", "--port", "${PORT}"]
    return {"backend": "command", "path": "m", "cmd": cmd, "memory": "10GiB", "gpu": 0, **keys}


async def test_an_idle_command_makes_room_for_another(serve: Serve, fake_bin: Path) -> None:
    models = {name: _command(fake_bin) for name in ("a", "b", "c")}
    async with serve(models, machine="rx7900xtx") as gw:
        for name in ("a", "b", "c"):
            path, body = chat("openai", name, stream=False)
            r = await gw.client.post(path, json=body)
            assert r.status_code == 200, r.text
        evicted = [e.model for e in gw.sup.events.history() if e.kind == EventKind.EVICT]
        assert evicted == ["a"] and gw.model("c").failure_kind is None


async def test_memory_held_by_kept_commands_is_a_409_at_once(serve: Serve, fake_bin: Path) -> None:
    models = {
        "kept": _command(fake_bin, pinned=True, preload=True),
        "stays": _command(fake_bin, swap="never", preload=True),
        "new": _command(fake_bin),
    }
    async with serve(models, machine="rx7900xtx") as gw:
        path, body = chat("openai", "new", stream=False)
        started = time.monotonic()
        r = await gw.client.post(path, json=body)
        assert time.monotonic() - started < 1.0
        assert r.status_code == 409, r.text
        assert r.headers["x-should-retry"] == "false"
        message, _ = error_of("openai", r.json())
        assert "loaded by rule" in message and "forge unload" in message
        rows = {m["name"]: m for m in (await gw.client.get("/api/models")).json()["models"]}
        assert rows["new"]["state"] == "stopped" and rows["new"]["failure_kind"] is None
        assert rows["kept"]["state"] == "ready" and rows["stays"]["state"] == "ready"
