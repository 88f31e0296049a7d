"""Yielding device memory to other programs: when to evict, and whom. Pure (no I/O, a clock to
inject), so the rules are tested in milliseconds; the supervisor's poll (:mod:`._yielding`) feeds it.

The rule, per device: **others' use grew** (used minus what forge's own children hold, per
process attribution) **and free memory fell below the reserve** → evict idle models on that
device, best score first, until the bytes they hold cover the shortfall.

* Only others' growth counts. Their level is remembered while the reserve holds (the baseline; it
  follows them down while it does not); forge's own children loading or growing never raise it.
  Growth under a noise floor (64 MiB or 1 % of the device, the larger) is a compositor's buffers,
  not a program that needs room.
* Hysteresis: the condition must hold on ``polls`` consecutive polls (2) before anything is
  evicted, and after an eviction the device is left alone for ``cooldown`` seconds while the driver
  hands the memory back. Once the reserve holds again the baseline moves up to the other program's
  new level, so an evicted model that a request loads again is not evicted again for the same
  program: no evict/reload loop.
* Never evicted: a model with requests in flight or waiting, one still loading, one ``pinned``.
* Score (Lemonade's): idle seconds / load seconds. Long idle and quick to load back goes first.
* A device where one of our models is loading or stopping is not judged that poll: the counters lag
  behind the child, and the difference is ours, not others'.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

__all__ = ["Candidate", "DeviceSample", "Eviction", "PressureWatch", "noise_floor"]

_MIB = 1024**2


def noise_floor(total: int) -> int:
    """Others' growth below this is noise: 64 MiB, or 1 % of the device when that is more."""
    return max(64 * _MIB, total // 100)


@dataclass(frozen=True)
class DeviceSample:
    """One device at one poll."""

    key: str
    total: int
    used: int
    ours: int
    """What forge's children hold on it (attributed per process where a source says so)."""
    reserve: int
    """Bytes to keep free for others (0: this device is not watched)."""
    settling: bool = False
    """One of our models on it is loading or stopping: its counters lag; not judged this poll."""
    top_other: tuple[int, str | None, int] | None = None
    """The other process holding the most on it: (pid, name, bytes), when attributed."""

    @property
    def free(self) -> int:
        return max(0, self.total - self.used)

    @property
    def others(self) -> int:
        return max(0, self.used - self.ours)


@dataclass(frozen=True)
class Candidate:
    """A loaded model as the policy sees it."""

    name: str
    bytes_by_device: Mapping[str, int]
    busy: bool
    """Requests in flight or waiting, or still loading: never evicted."""
    pinned: bool = False
    idle_seconds: float = 0.0
    load_seconds: float = 1.0

    @property
    def score(self) -> float:
        return self.idle_seconds / max(self.load_seconds, 0.1)


@dataclass(frozen=True)
class Eviction:
    """What to evict on one device, and why (the ``pressure`` event says this)."""

    device: str
    models: tuple[str, ...]
    free: int
    reserve: int
    growth: int
    """How much others' use grew since the reserve last held."""
    other: tuple[int, str | None, int] | None = None


@dataclass
class _DeviceState:
    baseline: int
    strikes: int = 0
    quiet_until: float = 0.0


@dataclass
class PressureWatch:
    """The policy's memory between polls."""

    polls: int = 2
    cooldown: float = 10.0
    clock: Callable[[], float] = time.monotonic
    _devices: dict[str, _DeviceState] = field(default_factory=dict, init=False)

    def observe(self, samples: Sequence[DeviceSample], candidates: Sequence[Candidate]) -> list[Eviction]:
        """One poll: the evictions to carry out now (usually none)."""
        now = self.clock()
        # A device none of ours is on any more forgets its baseline: when one is placed there again,
        # others' level at that time is the new normal (what grew while we were away is not ours to
        # yield).
        watched = {s.key for s in samples}
        for key in [k for k in self._devices if k not in watched]:
            del self._devices[key]
        out: list[Eviction] = []
        taken: set[str] = set()
        for s in samples:
            eviction = self._one(s, candidates, taken, now)
            if eviction is not None:
                taken.update(eviction.models)
                out.append(eviction)
        return out

    def _one(
        self, s: DeviceSample, candidates: Sequence[Candidate], taken: set[str], now: float
    ) -> Eviction | None:
        state = self._devices.get(s.key)
        if s.reserve <= 0 or s.settling:  # our own change in flight: the counters lag, not judged
            if state is not None:
                state.strikes = 0
            return None
        if state is None:  # first look: others' level now is the baseline
            state = self._devices[s.key] = _DeviceState(baseline=s.others)
        if s.free >= s.reserve:  # the reserve holds: others' level now is the new normal
            state.baseline, state.strikes = s.others, 0
            return None
        state.baseline = min(state.baseline, s.others)
        growth = s.others - state.baseline
        if growth < noise_floor(s.total):  # below the reserve, but not because others grew
            state.strikes = 0
            return None
        state.strikes += 1
        if state.strikes < self.polls or now < state.quiet_until:
            return None
        victims = _victims(s, candidates, taken)
        if not victims:
            return None
        state.strikes, state.quiet_until = 0, now + self.cooldown
        return Eviction(s.key, victims, s.free, s.reserve, growth, s.top_other)


def _victims(s: DeviceSample, candidates: Sequence[Candidate], taken: set[str]) -> tuple[str, ...]:
    """Idle, unpinned models on the device, best score first, until they cover the shortfall."""
    short = s.reserve - s.free
    eligible = [
        c
        for c in candidates
        if c.bytes_by_device.get(s.key, 0) > 0 and not c.busy and not c.pinned and c.name not in taken
    ]
    eligible.sort(key=lambda c: (-c.score, c.name))
    chosen: list[str] = []
    freed = 0
    for c in eligible:
        if freed >= short:
            break
        chosen.append(c.name)
        freed += c.bytes_by_device[s.key]
    return tuple(chosen)
