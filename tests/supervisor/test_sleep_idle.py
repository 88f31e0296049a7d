"""``sleep_idle``: the child gets ``--sleep-idle-seconds N``, and the model's status says when it
sleeps (``/props``' ``is_sleeping``, which does not wake it); a request wakes it. On the fake
llama-server (the state machine); tests/supervisor_real/test_sleep_idle.py runs the real one."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from rocmforge_supervisor.config import ForgeConfig
from tests.support.supervised import child_post, running, sleep_event

pytestmark = pytest.mark.anyio

MakeConfig = Callable[..., ForgeConfig]


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
        await sleep_event(events, True, timeout=10)
        assert m.status().to_json()["sleeping"] is True and m.status().state.value == "ready"
        r = await child_post(sup, "m", "/v1/completions", {"prompt": "hi"})
        assert r.status_code == 200
        await sleep_event(events, False, timeout=10)
        assert m.status().to_json()["sleeping"] is False


async def test_without_sleep_idle_no_flag(make_config: MakeConfig, fake_bin: Path) -> None:
    async with running(make_config({"m": {"preload": True}}), fake_bin) as sup:
        plan = sup.get("m").plan
        assert plan is not None and "--sleep-idle-seconds" not in plan.spec.extra_args
