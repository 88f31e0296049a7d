"""The Supervisor's own jobs, with the fake llama-server as every child: eviction order, reload
(unchanged / changed / removed / broken), and the stale-child sweep of the next run."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import anyio
import psutil
import pytest

from rocmforge_supervisor.config import ForgeConfig
from rocmforge_supervisor.process import ChildLedger
from rocmforge_supervisor.supervisor import EventKind, ModelState
from tests.support.supervised import alive, running, wait_state

pytestmark = pytest.mark.anyio

MakeConfig = Callable[..., ForgeConfig]

#: On the rx7900xtx fixture (24 GiB), a tiny model with this context needs ~9.5 GiB of KV cache:
#: two fit side by side, a third does not.
BIG = {"ctx_size": 8_000_000, "parallel": 1, "gpu": 0}


async def test_the_least_recently_used_idle_model_is_evicted(make_config: MakeConfig, fake_bin: Path) -> None:
    cfg = make_config({"a": BIG, "b": BIG, "c": BIG}, machine="rx7900xtx")
    async with running(cfg, fake_bin) as sup:
        await sup.load("a")
        await sup.load("b")
        async with sup.acquire("a"):  # a is used after b: b is now the least recently used
            pass
        await sup.load("c")
        evicted = [e.model for e in sup.events.history() if e.kind == EventKind.EVICT]
        assert evicted == ["b"]
        assert [sup.get(n).state for n in "abc"] == [ModelState.READY, ModelState.STOPPED, ModelState.READY]
        assert sup.get("c").status().devices == ["amd:0"]


async def test_a_busy_model_is_never_evicted(make_config: MakeConfig, fake_bin: Path) -> None:
    cfg = make_config({"a": BIG, "b": BIG, "c": BIG}, machine="rx7900xtx")
    async with running(cfg, fake_bin) as sup:
        await sup.load("b")
        await sup.load("a")  # a is the most recent; b the LRU, but b is busy
        async with sup.acquire("b"):
            await sup.load("c")
            assert sup.get("b").state == ModelState.READY
        assert [e.model for e in sup.events.history() if e.kind == EventKind.EVICT] == ["a"]


async def test_reload_keeps_replaces_removes_and_refuses(make_config: MakeConfig, fake_bin: Path) -> None:
    old = make_config({"same": {"preload": True}, "changed": {"preload": True}, "gone": {"preload": True}})
    async with running(old, fake_bin) as sup:
        pids = {n: sup.get(n).status().pid for n in ("same", "changed", "gone")}
        gone = sup.get("gone")
        new = make_config(
            {
                "same": {"preload": True, "ttl": 60},  # ttl is the gateway's: the child stays
                "changed": {"preload": True, "ctx_size": 1024},  # a new child, started first
                "added": {},
            }
        )
        summary = await sup.reload(new)
        assert summary == {
            "unchanged": ["same"],
            "changed": ["changed"],
            "added": ["added"],
            "removed": ["gone"],
            "failed": [],
        }
        assert sup.get("same").status().pid == pids["same"] and sup.get("same").ttl == 60
        assert sup.get("changed").status().pid not in (None, pids["changed"])
        plan = sup.get("changed").plan
        assert plan is not None and plan.spec.ctx_size == 1024
        await wait_state(gone, ModelState.STOPPED)
        assert "gone" not in sup.models and not alive(pids["gone"] or 0)
        with anyio.fail_after(5):
            while alive(pids["changed"] or 0):  # noqa: ASYNC110
                await anyio.sleep(0.02)  # polled: the old child's stop runs in the background

        broken = make_config(
            {"same": {"preload": True, "ttl": 60, "args": ["--fake-refuse"]}, "changed": {"ctx_size": 1024}}
        )
        summary = await sup.reload(broken)
        assert summary["failed"] == ["same"] and summary["changed"] == ["same"]
        assert sup.get("same").state == ModelState.READY and sup.get("same").status().pid == pids["same"]


async def test_the_next_run_stops_children_a_dead_supervisor_left(tmp_path: Path, fake_bin: Path) -> None:
    # A child of a supervisor that died hard: no longer anyone's child (bash exits at once, so it
    # is reparented), recorded in the ledger with a dead owner.
    out = await anyio.run_process(
        ["bash", "-c", f'"{fake_bin}" --port 0 --host 127.0.0.1 >/dev/null 2>&1 & echo $!']
    )
    orphan = psutil.Process(int(out.stdout))
    try:
        with anyio.fail_after(5):
            while "llama-server" not in orphan.cmdline()[:1]:  # noqa: ASYNC110
                await anyio.sleep(0.01)  # polled: the wrapper exec()s the fake
        ledger = ChildLedger(tmp_path)
        records = [{"pid": orphan.pid, "create_time": orphan.create_time(), "model": "m", "supervisor": 0}]
        ledger.path.write_text(json.dumps(records))
        assert await anyio.to_thread.run_sync(ledger.reap_stale) == [orphan.pid]
        assert _gone(orphan) and not ledger.path.exists()
    finally:
        if orphan.is_running():
            orphan.kill()


async def test_a_live_child_is_recorded_and_not_reaped_by_its_own_supervisor(
    make_config: MakeConfig, fake_bin: Path
) -> None:
    async with running(make_config({"m": {"preload": True}}), fake_bin) as sup:
        records = json.loads(sup.ledger.path.read_text())
        assert [(r["model"], r["pid"]) for r in records] == [("m", sup.get("m").status().pid)]
        assert sup.ledger.reap_stale() == []  # ours: left alone
        assert sup.get("m").state == ModelState.READY


def _gone(p: psutil.Process) -> bool:
    """Ended (a zombie waiting for whoever adopted it counts as ended)."""
    try:
        return not p.is_running() or p.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


async def test_acquire_says_loaded_once_the_model_is_ready_before_the_slot_wait(
    make_config: MakeConfig, fake_bin: Path
) -> None:
    """The one load wait of a request (issue 20, 3): ``loaded`` comes when the model is ready —
    not while it loads (that wait must be able to end in a real 503), but before the wait for a
    slot (a streamed request's keep-alive covers that one)."""
    cfg = make_config({"m": {"args": ["--fake-load-seconds", "0.3"], "max_concurrency": 1, "queue": 1}})
    async with running(cfg, fake_bin) as sup:
        m = sup.get("m")
        told: list[tuple[str, ModelState, int]] = []
        second_told = anyio.Event()

        async def queued() -> None:
            def loaded() -> None:
                told.append(("second", m.state, m.in_flight))
                second_told.set()

            async with sup.acquire("m", loaded=loaded):
                told.append(("second has its slot", m.state, m.in_flight))

        first = sup.acquire("m", loaded=lambda: told.append(("first", m.state, m.in_flight)))
        async with anyio.create_task_group() as tg, first:
            assert told == [("first", ModelState.READY, 0)]  # after the load, before the slot
            tg.start_soon(queued)
            with anyio.fail_after(5):
                await second_told.wait()  # told while the first still holds the only slot
            assert m.in_flight == 1 and m.waiting == 1
        assert told[1:] == [("second", ModelState.READY, 1), ("second has its slot", ModelState.READY, 1)]
        assert m.in_flight == 0 and m.waiting == 0


async def test_a_model_added_at_run_time_loads_with_default_residency(
    make_config: MakeConfig, fake_bin: Path, tiny_gguf: Path
) -> None:
    """``POST /api/models`` adds a model the config does not name: its residency comes from
    its own defaults, not from a lookup in the config."""
    async with running(make_config({"a": {}}), fake_bin) as sup:
        status = await sup.add_model("added", tiny_gguf)
        assert status.state == ModelState.READY
        res = sup.get("added").residency
        assert not res.pinned and not res.never_swap and res.group is None
