"""``sleep_idle`` on the real llama-server (SmolLM2 at the pin): the child frees its model after the
idle seconds, its ``/props`` says ``is_sleeping`` (asking does not wake it), and a request wakes it.
The state machine is tested on the fake in tests/supervisor/test_sleep_idle.py."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import anyio
import httpx
import pytest
from anyio.streams.memory import MemoryObjectReceiveStream

from rocmforge_supervisor.config import ForgeConfig
from rocmforge_supervisor.supervisor import Event, EventKind, Supervisor
from tests.support.supervised import running

pytestmark = pytest.mark.anyio

MakeConfig = Callable[..., ForgeConfig]


async def _sleep_event(events: MemoryObjectReceiveStream[Event], sleeping: bool, timeout: float) -> None:
    with anyio.fail_after(timeout):
        async for ev in events:
            if ev.kind == EventKind.SLEEP and ev.data["sleeping"] is sleeping:
                return


async def _request(sup: Supervisor, path: str, body: dict[str, object]) -> httpx.Response:
    async with sup.acquire("m") as up:
        headers = {"Authorization": f"Bearer {up.api_key}"}
        async with httpx.AsyncClient(base_url=up.base_url, headers=headers, timeout=60) as c:
            return await c.post(path, json=body)


async def test_real_llama_server_sleeps_and_wakes(
    make_config: MakeConfig, llama_server_bin: Path, smollm2_path: Path
) -> None:
    model = {"path": str(smollm2_path), "ctx_size": 1024, "args": ["--threads", "1"], "sleep_idle": 1}
    cfg = make_config({"m": {**model, "preload": True}})
    async with running(cfg, llama_server_bin) as sup, sup.events.subscribe() as events:
        await _sleep_event(events, True, timeout=12)
        server = sup.get("m").server
        assert server is not None
        props = await server.props()
        assert props is not None and props["is_sleeping"] is True  # asking did not wake it
        r = await _request(sup, "/completion", {"prompt": "Once upon a time", "n_predict": 4})
        assert r.status_code == 200 and r.json()["tokens_predicted"] >= 1
        await _sleep_event(events, False, timeout=5)
