"""``keep_context`` on the stop paths no real machine here produces cheaply — eviction for VRAM,
a save slower than ``stop_timeout`` — with the fake llama-server as every child (its ``/slots``
save and restore write and read a small file; see tests/support/fake_llama_server.py). The real
llama-server's save and restore are proven in tests/gateway/test_keep_context.py."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from rocmforge_supervisor.config import ForgeConfig
from rocmforge_supervisor.supervisor import EventKind, ModelState
from tests.support.supervised import running

pytestmark = pytest.mark.anyio

MakeConfig = Callable[..., ForgeConfig]

#: As in test_supervisor: on the rx7900xtx fixture two of these fit side by side, a third does not.
BIG = {"ctx_size": 8_000_000, "parallel": 1, "gpu": 0, "keep_context": True}


async def test_an_evicted_model_saves_and_comes_back_restored(
    make_config: MakeConfig, fake_bin: Path
) -> None:
    cfg = make_config({"a": BIG, "b": BIG, "c": BIG}, machine="rx7900xtx")
    async with running(cfg, fake_bin) as sup:
        for name in "abc":  # c evicts a, the least recently used
            await sup.load(name)
        await sup.load("a")  # a evicts b, and finds its slot again
        seen = [
            (e.model, e.kind)
            for e in sup.events.history()
            if e.kind in (EventKind.EVICT, EventKind.CONTEXT_SAVED, EventKind.CONTEXT_RESTORED)
        ]
        assert seen == [
            ("a", EventKind.EVICT),
            ("a", EventKind.CONTEXT_SAVED),
            ("b", EventKind.EVICT),
            ("b", EventKind.CONTEXT_SAVED),
            ("a", EventKind.CONTEXT_RESTORED),
        ]
        assert sup.get("a").status().contexts["restores"] == 1
        assert sup.get("b").status().contexts["count"] == 1


async def test_a_save_slower_than_stop_timeout_is_dropped_and_the_stop_stays_bounded(
    make_config: MakeConfig, fake_bin: Path
) -> None:
    slow = {"keep_context": True, "parallel": 1, "args": ["--fake-save-seconds", "30"]}
    cfg = make_config({"a": slow}, stop_timeout=1)
    async with running(cfg, fake_bin) as sup:
        await sup.load("a")
        t0 = time.monotonic()
        await sup.unload("a")
        took = time.monotonic() - t0
        assert sup.get("a").state == ModelState.STOPPED
        assert took < 5, f"the unload took {took:.1f} s"
        warnings = [e.data["message"] for e in sup.events.history() if e.kind == EventKind.CONTEXT_WARNING]
        assert any("longer than 1 s" in w for w in warnings), warnings
        assert sup.get("a").status().contexts["count"] == 0
        # The file the child was still writing when the save was dropped is gone too.
        d = sup.context_store.directory("a", create=False)
        assert list(d.iterdir()) == []


async def test_a_reload_snapshots_the_context_and_a_broken_new_config_keeps_the_old_child(
    make_config: MakeConfig, fake_bin: Path
) -> None:
    """Start-new-first stays with keep_context: the old child saves (and keeps serving) before the
    new one starts; when the new config fails, the old child is still the one serving."""
    kept = {"keep_context": True, "parallel": 1, "preload": True}
    async with running(make_config({"a": kept}), fake_bin) as sup:
        pid = sup.get("a").status().pid
        summary = await sup.reload(make_config({"a": {**kept, "args": ["--fake-refuse"]}}))
        assert summary["failed"] == ["a"]
        assert sup.get("a").state == ModelState.READY and sup.get("a").status().pid == pid
        kinds = [e.kind for e in sup.events.history() if e.model == "a"]
        assert EventKind.CONTEXT_SAVED in kinds and EventKind.CONTEXT_RESTORED not in kinds
        assert sup.get("a").status().contexts["count"] == 1
        # A good new config (args that leave the KV layout alone) restores the snapshot.
        await sup.reload(make_config({"a": {**kept, "args": ["--fake-chunks", "4"]}}))
        assert sup.get("a").status().pid != pid and sup.get("a").state == ModelState.READY
        restored = [e for e in sup.events.history() if e.kind == EventKind.CONTEXT_RESTORED]
        assert [e.model for e in restored] == ["a"]
        # Two spans, both in ms: forge's wait for the action (what the log prints) and the child's
        # own (the fake says 0.1 ms); the page shows both, so neither reads as the other's unit.
        data = restored[0].data
        assert data["restore_ms"] == 0.1 and data["ms"] > 0.1, data


async def test_status_reads_no_file_on_the_event_loop_and_follows_saves_and_forget(
    make_config: MakeConfig, fake_bin: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``status()`` runs on the event loop (every page refresh, every scrape): what it shows of the
    saved contexts is the summary read in a thread after each save or restore, never the disk."""
    from rocmforge_supervisor.supervisor.contexts._context_store import ContextStore

    kept = {"keep_context": True, "parallel": 1, "preload": True}
    async with running(make_config({"a": kept, "b": kept}), fake_bin) as sup:
        await sup.unload("a")  # saves a's slot

        def no_disk(self: ContextStore, model: str) -> list[object]:
            raise AssertionError(f"status() read {model!r}'s saved contexts from the disk")

        with monkeypatch.context() as mp:
            mp.setattr(ContextStore, "entries", no_disk)
            rows = {r.name: r for r in sup.status()}
            assert sup.get("a").status().contexts["count"] == 1
        assert rows["a"].contexts["count"] == 1 and rows["a"].contexts["bytes"] > 0
        assert rows["b"].contexts["count"] == 0
        await sup.load("a")  # restored (the save stays until the next one replaces it)
        assert sup.get("a").status().contexts["restores"] == 1
        await sup.unload("a", forget=True)
        assert sup.get("a").status().contexts["count"] == 0
