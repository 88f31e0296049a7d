"""``sleep_idle``: the child gets ``--sleep-idle-seconds N``, and the model's status says when it
sleeps (``/props``' ``is_sleeping``, which does not wake it); a request wakes it. On the fake
llama-server (the state machine); tests/supervisor_real/test_sleep_idle.py runs the real one."""

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


async def test_sleeping_shows_in_the_status_and_a_request_wakes_it(
    make_config: MakeConfig, fake_bin: Path
) -> None:
    cfg = make_config({"m": {"sleep_idle": 1, "preload": True}})
    async with running(cfg, fake_bin) as sup, sup.events.subscribe() as events:
        m = sup.get("m")
        assert m.plan is not None
        args = list(m.plan.spec.extra_args)
        assert args[args.index("--sleep-idle-seconds") + 1] == "1"
        assert m.status().to_json()["sleeping"] is False
        await _sleep_event(events, True, timeout=10)
        assert m.status().to_json()["sleeping"] is True and m.status().state.value == "ready"
        r = await _request(sup, "/v1/completions", {"prompt": "hi"})
        assert r.status_code == 200
        await _sleep_event(events, False, timeout=10)
        assert m.status().to_json()["sleeping"] is False


async def test_without_sleep_idle_no_flag(make_config: MakeConfig, fake_bin: Path) -> None:
    async with running(make_config({"m": {"preload": True}}), fake_bin) as sup:
        plan = sup.get("m").plan
        assert plan is not None and "--sleep-idle-seconds" not in plan.spec.extra_args
