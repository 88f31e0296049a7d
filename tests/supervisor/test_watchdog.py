"""The progress watchdog: a busy child whose slots make no progress is reset; idle or slow-but-moving
children are not. The rule is tested here in milliseconds with a clock of its own; the wedge (a
task loop frozen while /health answers) and a slow-but-moving prompt are tested on the real
llama-server in tests/supervisor_real/test_watchdog.py."""

from __future__ import annotations

import pytest

from rocmforge_supervisor.supervisor.model._watchdog import ProgressWatch, poll_interval, slots_signature


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _slot(decoded: int, prompt: int = 5, task: int = 1, processing: bool = True) -> dict[str, object]:
    return {
        "id": 0,
        "id_task": task,
        "is_processing": processing,
        "n_prompt_tokens_processed": prompt,
        "next_token": [{"n_decoded": decoded}],
    }


def test_signature_reads_only_processing_slots() -> None:
    sig = slots_signature([_slot(3), {**_slot(9), "id": 1, "is_processing": False}])
    assert sig == ((0, 1, 3, 5),)
    assert slots_signature({"error": "nope"}) is None
    assert slots_signature([]) == ()


def test_busy_without_progress_is_a_stall_and_idle_never_is() -> None:
    clock = Clock()
    watch = ProgressWatch(10.0, clock=clock)
    for _ in range(5):  # idle for a long time: never a stall
        clock.now += 100
        assert not watch.observe(False, None)
    assert not watch.observe(True, slots_signature([_slot(1)]))
    clock.now += 9
    assert not watch.observe(True, slots_signature([_slot(1)]))
    clock.now += 1
    assert watch.observe(True, slots_signature([_slot(1)]))  # 10 s without a new token
    assert watch.stalled_for == pytest.approx(10.0)


def test_any_counter_moving_is_progress() -> None:
    clock = Clock()
    watch = ProgressWatch(10.0, clock=clock)
    steps = [_slot(0, prompt=512), _slot(0, prompt=1024), _slot(1, prompt=1024), _slot(0, task=2)]
    for slot in steps:  # a prompt batch, a token, a new task: each is progress
        clock.now += 9.5
        assert not watch.observe(True, slots_signature([slot]))


def test_a_silent_slots_route_is_no_progress() -> None:
    clock = Clock()
    watch = ProgressWatch(4.0, clock=clock)
    assert not watch.observe(True, slots_signature([_slot(1)]))
    clock.now += 2
    assert not watch.observe(True, None)
    clock.now += 2
    assert watch.observe(True, None)


def test_poll_interval_bounds() -> None:
    assert poll_interval(120) == 5.0 and poll_interval(2) == 0.5 and poll_interval(0.1) == 0.1
