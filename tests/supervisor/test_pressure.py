"""The memory-pressure policy, pure: a fake clock and made-up devices, so each rule runs in ms.

A 24 GiB GPU, a 2 GiB reserve, two of our idle models holding 6 GiB and 4 GiB; another program's
use grows step by step.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from rocmforge_supervisor.config._values import parse_reserve, reserve_bytes
from rocmforge_supervisor.supervisor.placement._pressure import (
    Candidate,
    DeviceSample,
    PressureWatch,
    noise_floor,
)

GIB = 1024**3
TOTAL = 24 * GIB
RESERVE = 2 * GIB


@dataclass
class Clock:
    now: float = 1000.0

    def __call__(self) -> float:
        return self.now


def sample(
    others: int, ours: int = 10 * GIB, *, settling: bool = False, reserve: int = RESERVE
) -> DeviceSample:
    return DeviceSample("amd:0", TOTAL, others + ours, ours, reserve, settling, (4242, "game", others))


def models(**over: Candidate) -> list[Candidate]:
    base = {
        # a: idle 100 s, loads in 10 s → score 10; b: idle 50 s, loads in 1 s → score 50 (goes first)
        "a": Candidate("a", {"amd:0": 6 * GIB}, busy=False, idle_seconds=100, load_seconds=10),
        "b": Candidate("b", {"amd:0": 4 * GIB}, busy=False, idle_seconds=50, load_seconds=1),
    }
    base.update(over)
    return list(base.values())


def test_others_growing_past_the_reserve_evicts_on_the_second_poll_in_score_order() -> None:
    clock = Clock()
    watch = PressureWatch(polls=2, cooldown=10, clock=clock)
    # 10 GiB ours + 4 GiB others: 10 GiB free. The other program grows 4 GiB per poll.
    for others in (4 * GIB, 8 * GIB, 12 * GIB):  # free 10, 6, 2 GiB: the reserve holds
        assert watch.observe([sample(others)], models()) == []
        clock.now += 2
    assert watch.observe([sample(13 * GIB)], models()) == []  # free 1 GiB: first poll below
    clock.now += 2
    [ev] = watch.observe([sample(13 * GIB)], models())  # second consecutive poll: act
    assert ev.models == ("b",)  # score 50 before score 10; b's 4 GiB cover the 1 GiB short
    assert ev.other == (4242, "game", 13 * GIB)
    assert ev.growth == 1 * GIB and ev.free == 1 * GIB and ev.reserve == RESERVE


def test_as_many_as_the_shortfall_needs() -> None:
    clock = Clock()
    watch = PressureWatch(polls=2, cooldown=10, clock=clock)
    watch.observe([sample(4 * GIB)], models())
    # ours 10 + others 13.5 = 23.5 GiB: 0.5 GiB free, 1.5 GiB short of the reserve
    assert watch.observe([sample(int(13.5 * GIB))], models()) == []
    [ev] = watch.observe([sample(int(13.5 * GIB))], models())
    assert ev.models == ("b",)
    # when b alone cannot cover it, a goes too
    watch = PressureWatch(polls=2, cooldown=10, clock=clock)
    small_b = Candidate("b", {"amd:0": GIB // 4}, busy=False, idle_seconds=50, load_seconds=1)
    watch.observe([sample(4 * GIB)], models(b=small_b))
    watch.observe([sample(int(13.5 * GIB))], models(b=small_b))
    [ev] = watch.observe([sample(int(13.5 * GIB))], models(b=small_b))
    assert ev.models == ("b", "a")


def test_busy_and_pinned_models_are_never_evicted() -> None:
    clock = Clock()
    busy_b = Candidate("b", {"amd:0": 4 * GIB}, busy=True, idle_seconds=50, load_seconds=1)
    pinned_a = Candidate("a", {"amd:0": 6 * GIB}, busy=False, pinned=True, idle_seconds=100, load_seconds=10)
    watch = PressureWatch(polls=2, cooldown=10, clock=clock)
    watch.observe([sample(4 * GIB)], models())
    for _ in range(5):
        assert watch.observe([sample(13 * GIB)], models(b=busy_b, a=pinned_a)) == []
    # once b is idle again it goes (a stays pinned)
    [ev] = watch.observe([sample(13 * GIB)], models(a=pinned_a))
    assert ev.models == ("b",)


def test_our_own_growth_is_never_pressure() -> None:
    clock = Clock()
    watch = PressureWatch(polls=2, cooldown=10, clock=clock)
    watch.observe([sample(4 * GIB, ours=10 * GIB)], models())
    # our children grow (a third model loaded, a bigger context): 1 GiB free, others unchanged
    for _ in range(10):
        assert watch.observe([sample(4 * GIB, ours=19 * GIB)], models()) == []
        clock.now += 2


def test_noise_below_the_floor_is_not_growth() -> None:
    clock = Clock()
    watch = PressureWatch(polls=2, cooldown=10, clock=clock)
    watch.observe([sample(4 * GIB, ours=19 * GIB)], models())  # 1 GiB free from the start: ours
    jitter = noise_floor(TOTAL) - 1
    for _ in range(5):
        assert watch.observe([sample(4 * GIB + jitter, ours=19 * GIB)], models()) == []


def test_no_evict_reload_loop() -> None:
    """Evicted for a program that keeps its memory; the model is loaded again (a request): its
    reload is ours, and must not be evicted again for the same program."""
    clock = Clock()
    watch = PressureWatch(polls=2, cooldown=10, clock=clock)
    watch.observe([sample(4 * GIB)], models())
    watch.observe([sample(13 * GIB)], models())
    [ev] = watch.observe([sample(13 * GIB)], models())
    assert ev.models == ("b",)
    # b stops: ours 6 GiB, 5 GiB free; the stop settles, then the reserve holds again for a while
    clock.now += 2
    assert watch.observe([sample(13 * GIB, ours=6 * GIB, settling=True)], models()) == []
    for _ in range(3):
        clock.now += 2
        assert watch.observe([sample(13 * GIB, ours=6 * GIB)], models(b=Candidate("b", {}, busy=False))) == []
    # b loads again (settling while it loads), then is ready at 10 GiB ours: 1 GiB free again
    assert watch.observe([sample(13 * GIB, ours=10 * GIB, settling=True)], models()) == []
    for _ in range(20):
        clock.now += 2
        assert watch.observe([sample(13 * GIB)], models()) == []


def test_cooldown_then_more_when_the_reserve_still_does_not_hold() -> None:
    clock = Clock()
    watch = PressureWatch(polls=2, cooldown=10, clock=clock)
    watch.observe([sample(4 * GIB)], models())
    watch.observe([sample(13 * GIB)], models())
    [ev] = watch.observe([sample(13 * GIB)], models())
    assert ev.models == ("b",)
    # b is gone, but the other program grew on: 0.5 GiB free with only a (6 GiB) left
    remaining = [m for m in models() if m.name == "a"]
    for _ in range(4):  # within the cooldown the driver hands memory back: nothing more
        clock.now += 2
        assert watch.observe([sample(int(17.5 * GIB), ours=6 * GIB)], remaining) == []
    clock.now += 2
    [ev] = watch.observe([sample(int(17.5 * GIB), ours=6 * GIB)], remaining)
    assert ev.models == ("a",)


def test_a_device_left_and_placed_again_takes_a_new_baseline() -> None:
    """Others grew while none of ours was on the device: not ours to yield, when we come back."""
    clock = Clock()
    watch = PressureWatch(polls=2, cooldown=10, clock=clock)
    watch.observe([sample(4 * GIB)], models())
    assert watch.observe([], []) == []  # nothing of ours there for a while
    assert watch.observe([sample(4 * GIB, settling=True)], models()) == []  # loading: not judged
    for _ in range(5):  # placed again next to a program that grew meanwhile: 1 GiB free
        assert watch.observe([sample(13 * GIB)], models()) == []


def test_off_when_the_reserve_is_zero() -> None:
    watch = PressureWatch(polls=1, cooldown=0, clock=Clock())
    watch.observe([sample(0, reserve=0)], models())
    assert watch.observe([sample(14 * GIB, reserve=0)], models()) == []


@pytest.mark.parametrize(
    ("raw", "on_24_gib"),
    [
        ("5%", int(TOTAL * 0.05)),
        (0.1, int(TOTAL * 0.1)),
        ("2GiB", 2 * GIB),
        ("512MiB", 512 * 1024**2),
        (0, 0),
    ],
)
def test_reserve_spellings(raw: object, on_24_gib: int) -> None:
    assert reserve_bytes(parse_reserve(raw), TOTAL) == on_24_gib
