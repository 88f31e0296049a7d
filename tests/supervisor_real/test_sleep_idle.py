"""``sleep_idle`` on the real llama-server (SmolLM2 at the pin): the child frees its model after the
idle seconds, its ``/props`` says ``is_sleeping`` (asking does not wake it), and a request wakes it.
The state machine is tested on the fake in tests/supervisor/test_sleep_idle.py."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from rocmforge_supervisor.config import ForgeConfig
from tests.support.supervised import child_post, running, sleep_event

pytestmark = pytest.mark.anyio

MakeConfig = Callable[..., ForgeConfig]


async def test_real_llama_server_sleeps_and_wakes(
    make_config: MakeConfig, llama_server_bin: Path, smollm2_path: Path
) -> None:
    model = {"path": str(smollm2_path), "ctx_size": 1024, "args": ["--threads", "1"], "sleep_idle": 1}
    cfg = make_config({"m": {**model, "preload": True}})
    async with running(cfg, llama_server_bin) as sup, sup.events.subscribe() as events:
        await sleep_event(events, True, timeout=12)
        server = sup.get("m").server
        assert server is not None
        props = await server.props()
        assert props is not None and props["is_sleeping"] is True  # asking did not wake it
        r = await child_post(sup, "m", "/completion", {"prompt": "Once upon a time", "n_predict": 4})
        assert r.status_code == 200 and r.json()["tokens_predicted"] >= 1
        await sleep_event(events, False, timeout=5)
