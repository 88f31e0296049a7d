"""The admission queue (``supervisor._admission``): which waiting request gets a freed slot.

Driven through anyio tasks: each waiter is queued in a known order
(``wait_all_tasks_blocked`` between starts), then slots are freed one at a time and the order
in which the waiters got them is read. A fake clock drives aging: no sleeps.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio import wait_all_tasks_blocked
from anyio.abc import TaskGroup

from rocmforge_supervisor.access import PriorityClass
from rocmforge_supervisor.supervisor.admission._admission import Admission
from tests.support.supervised import running

pytestmark = pytest.mark.anyio


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def _queue(
    tg: TaskGroup, adm: Admission, order: list[str], cls: PriorityClass, key: str | None, tag: str
) -> None:
    async def one() -> None:
        await adm.take(cls, key)
        order.append(tag)

    tg.start_soon(one)
    await wait_all_tasks_blocked()


async def _drain(adm: Admission, order: list[str], n: int, cls: PriorityClass, key: str | None) -> None:
    """Free the holder's slot, then each granted waiter's, one at a time, ``n`` grants in all."""
    adm.give(cls, key)
    for _ in range(n):
        before = len(order)
        with anyio.fail_after(5):
            while len(order) == before:
                await wait_all_tasks_blocked()
        tag = order[-1]
        c, _, k = tag.partition(":")
        adm.give(c, k.split("#")[0] or None)  # type: ignore[arg-type]


async def test_three_classes_three_keys_order() -> None:
    """Higher classes first; within a class, round robin between keys in the order they came."""
    adm = Admission(1, aging=0)
    order: list[str] = []
    await adm.take("interactive", "holder")
    async with anyio.create_task_group() as tg:
        arrivals = [
            ("background", "k1", "#1"),
            ("batch", "k1", "#1"),
            ("batch", "k1", "#2"),
            ("batch", "k1", "#3"),
            ("background", "k2", "#1"),
            ("interactive", "k1", "#1"),
            ("interactive", "k1", "#2"),
            ("batch", "k2", "#1"),
            ("interactive", "k2", "#1"),
            ("batch", "k3", "#1"),
            ("interactive", "k3", "#1"),
            ("background", "k3", "#1"),
        ]
        for cls, key, n in arrivals:
            await _queue(tg, adm, order, cls, key, f"{cls}:{key}{n}")  # type: ignore[arg-type]
        assert adm.waiting_by_class() == {"interactive": 4, "batch": 5, "background": 3}
        assert adm.waiting_by_key() == {"k1": 6, "k2": 3, "k3": 3}
        await _drain(adm, order, len(arrivals), "interactive", "holder")
    assert order == [
        "interactive:k1#1",
        "interactive:k2#1",
        "interactive:k3#1",
        "interactive:k1#2",
        "batch:k1#1",
        "batch:k2#1",
        "batch:k3#1",
        "batch:k1#2",
        "batch:k1#3",
        "background:k1#1",
        "background:k2#1",
        "background:k3#1",
    ]
    assert adm.in_use == 0


async def test_fifo_within_one_key_and_class() -> None:
    adm = Admission(1, aging=0)
    order: list[str] = []
    await adm.take("batch", "a")
    async with anyio.create_task_group() as tg:
        for i in range(4):
            await _queue(tg, adm, order, "batch", "a", f"batch:a#{i}")
        await _drain(adm, order, 4, "batch", "a")
    assert order == [f"batch:a#{i}" for i in range(4)]


async def test_aging_serves_a_batch_request_under_constant_interactive_load() -> None:
    """Before ``aging`` seconds the waiting batch request is passed over by every interactive one;
    once it has waited that long, the next freed slot is its."""
    clock = Clock()
    adm = Admission(1, aging=10.0, clock=clock)
    order: list[str] = []
    await adm.take("interactive", "holder")
    async with anyio.create_task_group() as tg:
        await _queue(tg, adm, order, "batch", "night", "batch:night#0")
        for step in range(3):  # interactive requests keep coming; each is served first
            clock.now += 3.0
            await _queue(tg, adm, order, "interactive", "chat", f"interactive:chat#{step}")
            adm.give("interactive", "holder" if step == 0 else "chat")
            await wait_all_tasks_blocked()
            assert order[-1] == f"interactive:chat#{step}"
        clock.now = 10.0  # the batch request has waited `aging` seconds
        await _queue(tg, adm, order, "interactive", "chat", "interactive:chat#3")
        adm.give("interactive", "chat")
        await wait_all_tasks_blocked()
        assert order[-1] == "batch:night#0"
        adm.give("batch", "night")
        await wait_all_tasks_blocked()
        assert order[-1] == "interactive:chat#3"
        adm.give("interactive", "chat")


async def test_without_aging_a_batch_request_waits_while_interactive_ones_come() -> None:
    clock = Clock()
    adm = Admission(1, aging=0, clock=clock)
    order: list[str] = []
    await adm.take("interactive", "holder")
    async with anyio.create_task_group() as tg:
        await _queue(tg, adm, order, "batch", "night", "batch:night#0")
        clock.now = 1000.0
        await _queue(tg, adm, order, "interactive", "chat", "interactive:chat#0")
        adm.give("interactive", "holder")
        await wait_all_tasks_blocked()
        assert order == ["interactive:chat#0"]
        adm.give("interactive", "chat")
        await wait_all_tasks_blocked()
        assert order[-1] == "batch:night#0"
        adm.give("batch", "night")


async def test_interactive_slots_keep_a_slot_free_for_interactive() -> None:
    """With 2 slots and ``interactive_slots = 1`` the lower classes hold at most one: a second
    batch request waits beside a free slot, and an interactive one takes that slot at once."""
    adm = Admission(2, interactive_slots=1, aging=0)
    order: list[str] = []
    async with anyio.create_task_group() as tg:
        await _queue(tg, adm, order, "batch", "a", "batch:a#0")
        await _queue(tg, adm, order, "background", "b", "background:b#0")
        assert order == ["batch:a#0"]
        assert adm.in_use == 1 and adm.waiting_by_class()["background"] == 1
        await _queue(tg, adm, order, "interactive", "c", "interactive:c#0")
        assert order == ["batch:a#0", "interactive:c#0"]
        adm.give("batch", "a")
        await wait_all_tasks_blocked()
        assert order[-1] == "background:b#0"
        adm.give("background", "b")
        adm.give("interactive", "c")
    assert adm.in_use == 0


async def test_interactive_slots_leave_the_lower_classes_one_slot() -> None:
    adm = Admission(1, interactive_slots=5, aging=0)
    with anyio.fail_after(5):
        await adm.take("background", None)
    adm.give("background", None)


async def test_a_cancelled_waiter_leaves_the_queue() -> None:
    adm = Admission(1, aging=0)
    order: list[str] = []
    await adm.take("interactive", None)
    async with anyio.create_task_group() as tg:
        with anyio.CancelScope() as scope:
            scope.cancel()
            with pytest.raises(anyio.get_cancelled_exc_class()):
                await adm.take("batch", "gone")
        assert adm.waiting_by_class()["batch"] == 0
        await _queue(tg, adm, order, "batch", "b", "batch:b#0")
        adm.give("interactive", None)
        await wait_all_tasks_blocked()
    assert order == ["batch:b#0"]


async def test_resize_grants_waiters_the_new_slots() -> None:
    adm = Admission(1, aging=0)
    order: list[str] = []
    await adm.take("interactive", None)
    async with anyio.create_task_group() as tg:
        await _queue(tg, adm, order, "batch", "x", "batch:x#0")
        assert order == []
        adm.resize(2, 0, 0)
        await wait_all_tasks_blocked()
        assert order == ["batch:x#0"]
        adm.give("batch", "x")
        adm.give("interactive", None)


async def test_a_reload_changes_interactive_slots_and_aging_in_place(
    make_config: Any, fake_bin: Path
) -> None:
    """``interactive_slots`` and ``priority_aging`` are the queue's: a reload applies them to the
    running model's admission queue without a new child, and acquire queues by class and key."""
    cfg = make_config({"m": {"preload": True, "max_concurrency": 2}})
    async with running(cfg, fake_bin) as sup:
        m = sup.get("m")
        await sup.load("m")
        pid = m.status().pid
        new = make_config(
            {"m": {"preload": True, "max_concurrency": 2, "interactive_slots": 1}}, priority_aging=5
        )
        summary = await sup.reload(new)
        assert summary["unchanged"] == ["m"]
        m = sup.get("m")
        assert m.status().pid == pid
        assert (m.admission.slots, m.admission.interactive_slots, m.admission.aging) == (2, 1, 5.0)
        async with sup.acquire("m", priority="batch", key="night"):
            assert m.admission.in_flight_by_class()["batch"] == 1
            assert m.status().queue["in_flight"] == {"interactive": 0, "batch": 1, "background": 0}
            with anyio.move_on_after(0.2) as scope:  # the one slot left is kept for interactive
                async with sup.acquire("m", priority="background", key="night"):
                    pass
            assert scope.cancelled_caught
            async with sup.acquire("m", key="chat"):  # interactive: gets it at once
                assert m.admission.in_use == 2
        assert m.admission.in_use == 0 and m.waiting == 0
