"""The residency rules with the real Supervisor and the FAKE llama-server as every child: pins that
hold, never-swap, groups (max_loaded, exclusive, busy members), the warm default, and rules that
change on reload without a restart.

On the rx7900xtx fixture (24 GiB) two ``BIG`` models fit side by side and a third does not.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest

from rocmforge_supervisor._errors import ResidencyConflict
from rocmforge_supervisor.config import ForgeConfig
from rocmforge_supervisor.supervisor import EventKind, ModelState, Supervisor
from tests.support.supervised import running, wait_state

pytestmark = pytest.mark.anyio

MakeConfig = Callable[..., ForgeConfig]

BIG = {"ctx_size": 8_000_000, "parallel": 1, "gpu": 0}
SMALL = {"ctx_size": 2048, "parallel": 1}


def _evictions(sup: Supervisor) -> list[tuple[str, str]]:
    return [(e.model, str(e.data.get("rule"))) for e in sup.events.history() if e.kind == EventKind.EVICT]


async def test_a_pinned_model_stays_and_the_next_idle_one_makes_room(
    make_config: MakeConfig, fake_bin: Path
) -> None:
    cfg = make_config({"a": {**BIG, "pinned": True}, "b": BIG, "c": BIG}, machine="rx7900xtx")
    async with running(cfg, fake_bin) as sup:
        await sup.load("a")  # a is the least recently used from here on, but pinned
        for name in ("b", "c", "b", "c"):
            await sup.load(name)
        assert sup.get("a").state == ModelState.READY and sup.get("a").restarts == 0
        assert [m for m, _ in _evictions(sup)] == ["b", "c", "b"]
        assert all("evict_cost" in rule for _, rule in _evictions(sup))


@pytest.mark.parametrize(
    ("keys", "rule"), [({"pinned": True}, "pinned"), ({"swap": "never"}, 'swap = "never"')]
)
async def test_a_load_that_needs_a_kept_model_gone_is_refused_at_once_and_not_failed(
    make_config: MakeConfig, fake_bin: Path, keys: dict[str, object], rule: str
) -> None:
    cfg = make_config({"a": {**BIG, **keys}, "b": {**BIG, **keys}, "c": BIG}, machine="rx7900xtx")
    async with running(cfg, fake_bin) as sup:
        await sup.load("a")
        await sup.load("b")
        started = time.monotonic()
        with pytest.raises(ResidencyConflict) as err:
            await sup.load("c")
        assert time.monotonic() - started < 1.0
        assert err.value.rule == rule and "a (" in str(err.value) and "more on amd:0" in str(err.value)
        c = sup.get("c")
        assert c.state == ModelState.STOPPED and c.failure_kind is None  # no breaker: not a failure
        refused = [e for e in sup.events.history("c") if e.kind == EventKind.REFUSED]
        assert [e.data["rule"] for e in refused] == [rule]
        # A second request asks the rules again (and is refused again, still at once).
        with pytest.raises(ResidencyConflict):
            async with sup.acquire("c", load_wait=5):
                pass
        await sup.unload("b")  # the user makes room: now c loads, nothing else is touched
        await sup.load("c")
        assert sup.get("a").state == ModelState.READY and _evictions(sup) == []


async def test_never_swap_still_yields_to_its_ttl(make_config: MakeConfig, fake_bin: Path) -> None:
    cfg = make_config({"a": {**SMALL, "swap": "never", "ttl": 0.3}})
    async with running(cfg, fake_bin) as sup:
        await sup.load("a")
        await wait_state(sup.get("a"), ModelState.STOPPED, timeout=5)
        assert any(e.kind == EventKind.TTL for e in sup.events.history("a"))


async def test_group_max_loaded_swaps_members_but_leaves_others_alone(
    make_config: MakeConfig, fake_bin: Path
) -> None:
    cfg = make_config(
        {"x": SMALL, "y": SMALL, "z": SMALL, "solo": SMALL},
        groups={"chat": {"members": ["x", "y", "z"], "max_loaded": 1}},
    )
    async with running(cfg, fake_bin) as sup:
        await sup.load("solo")
        await sup.load("x")
        await sup.load("y")
        await sup.load("z")
        assert _evictions(sup) == [
            ("x", "group 'chat' has max_loaded = 1"),
            ("y", "group 'chat' has max_loaded = 1"),
        ]
        assert sup.get("solo").state == ModelState.READY
        assert sup.get("z").status().to_json()["residency"]["group"] == "chat"


async def test_a_group_whose_members_are_busy_makes_the_load_wait_then_swaps(
    make_config: MakeConfig, fake_bin: Path
) -> None:
    cfg = make_config({"x": SMALL, "y": SMALL}, groups={"chat": {"members": ["x", "y"], "max_loaded": 1}})
    async with running(cfg, fake_bin) as sup:
        await sup.load("x")
        async with anyio.create_task_group() as tg:
            async with sup.acquire("x"):  # x is busy: y's load waits for it
                tg.start_soon(sup.load, "y")
                y = sup.get("y")
                with anyio.fail_after(5):
                    while not any(e.kind == EventKind.WAITING for e in sup.events.history("y")):
                        await y.changed()
                assert y.state == ModelState.LOADING and sup.get("x").state == ModelState.READY
            await wait_state(y, ModelState.READY, timeout=10)
        assert sup.get("x").state == ModelState.STOPPED and [m for m, _ in _evictions(sup)] == ["x"]


async def test_group_members_that_stay_by_rule_refuse_the_next_member(
    make_config: MakeConfig, fake_bin: Path
) -> None:
    cfg = make_config(
        {"x": {**SMALL, "pinned": True}, "y": SMALL},
        groups={"chat": {"members": ["x", "y"], "max_loaded": 1}},
    )
    async with running(cfg, fake_bin) as sup:
        await sup.load("x")
        with pytest.raises(ResidencyConflict, match=r"max_loaded = 1.*x \(pinned\)"):
            await sup.load("y")


async def test_an_exclusive_group_clears_everything_but_kept_models(
    make_config: MakeConfig, fake_bin: Path
) -> None:
    cfg = make_config(
        {"x": SMALL, "out": SMALL, "kept": {**SMALL, "pinned": True}},
        groups={"solo": {"members": ["x"], "exclusive": True}},
    )
    async with running(cfg, fake_bin) as sup:
        await sup.load("out")
        await sup.load("kept")
        await sup.load("x")
        assert _evictions(sup) == [("out", "group 'solo' is exclusive")]
        assert sup.get("kept").state == ModelState.READY


async def test_a_pinned_models_crashed_child_restarts_in_place(
    make_config: MakeConfig, fake_bin: Path
) -> None:
    cfg = make_config({"a": {**BIG, "pinned": True}, "b": BIG}, machine="rx7900xtx")
    async with running(cfg, fake_bin) as sup:
        status = await sup.load("a")
        await sup.load("b")
        assert status.pid is not None
        os.kill(status.pid, signal.SIGKILL)
        a = sup.get("a")
        await wait_state(a, ModelState.LOADING, timeout=5)
        await wait_state(a, ModelState.READY, timeout=10)
        assert a.status().pid not in (None, status.pid) and sup.get("b").state == ModelState.READY


async def test_the_warm_default_comes_back_when_its_memory_is_free(
    make_config: MakeConfig, fake_bin: Path
) -> None:
    cfg = make_config({"d": {**BIG, "default": True}, "a": BIG, "b": BIG}, machine="rx7900xtx")
    async with running(cfg, fake_bin) as sup:
        d = sup.get("d")
        await wait_state(d, ModelState.READY, timeout=10)  # loaded at start, without a request
        await sup.load("a")
        await sup.load("b")  # no room for three: d (the least recently used) makes room
        assert [m for m, _ in _evictions(sup)] == ["d"]
        await sup.unload("b")
        await wait_state(d, ModelState.READY, timeout=10)  # back, idle, without a request
        assert sup.get("a").state == ModelState.READY
        assert sum(e.kind == EventKind.WARM for e in sup.events.history("d")) >= 2
        # While it does not fit, the tries are quiet: no failure, no refusal.
        await sup.load("b")
        await sup.unload("a")
        await wait_state(d, ModelState.READY, timeout=10)
        assert d.failure_kind is None and not [
            e for e in sup.events.history("d") if e.kind == EventKind.REFUSED
        ]


async def test_an_explicit_unload_of_the_default_holds_it_until_it_is_used(
    make_config: MakeConfig, fake_bin: Path
) -> None:
    cfg = make_config({"d": {**SMALL, "default": True}, "a": SMALL})
    async with running(cfg, fake_bin) as sup:
        d = sup.get("d")
        await wait_state(d, ModelState.READY, timeout=10)
        await sup.unload("d")
        await sup.load("a")
        await sup.unload("a")  # memory freed: still no warm load, the user unloaded d
        assert d.state == ModelState.STOPPED
        async with sup.acquire("d", load_wait=10):
            pass
        assert d.state == ModelState.READY


async def test_rules_change_on_reload_without_a_restart(make_config: MakeConfig, fake_bin: Path) -> None:
    cfg = make_config({"a": {**BIG, "preload": True}, "b": BIG, "c": BIG}, machine="rx7900xtx")
    async with running(cfg, fake_bin) as sup:
        pid = sup.get("a").status().pid
        summary = await sup.reload(
            make_config(
                {"a": {**BIG, "preload": True, "pinned": True}, "b": BIG, "c": BIG}, machine="rx7900xtx"
            )
        )
        assert summary["unchanged"] == ["a", "b", "c"]
        assert sup.get("a").status().pid == pid and sup.get("a").residency.pinned
        await sup.load("b")
        await sup.load("c")
        assert [m for m, _ in _evictions(sup)] == ["b"]


async def test_loads_queue_behind_an_eviction_and_a_group_never_overfills(
    make_config: MakeConfig, fake_bin: Path
) -> None:
    cfg = make_config(
        {"x": SMALL, "y": SMALL, "z": SMALL}, groups={"chat": {"members": ["x", "y", "z"], "max_loaded": 1}}
    )
    async with running(cfg, fake_bin) as sup:
        await sup.load("x")
        loaded_at_once: list[int] = []

        def count() -> None:
            loaded_at_once.append(sum(m.as_loaded() is not None for m in sup.models.values()))

        for m in sup.models.values():
            m.on_ready.append(lambda _m: count())

        async def ask(name: str) -> None:
            async with sup.acquire(name, load_wait=20):
                pass

        async with anyio.create_task_group() as tg:  # four requests for two members at once
            for name in ("y", "y", "z", "z"):
                tg.start_soon(ask, name)
        assert loaded_at_once and max(loaded_at_once) == 1
        assert sum(m.state == ModelState.READY for m in sup.models.values()) == 1
        evicted = [m for m, _ in _evictions(sup)]
        assert evicted[0] == "x" and len(evicted) == 2  # y and z took turns: one swap each way
