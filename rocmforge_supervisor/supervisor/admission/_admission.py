"""A model's admission queue: who gets the next free slot at its child.

One object per model (:class:`Admission`) replaces a plain FIFO semaphore, so that a person's chat
message is not queued behind a night job's thousand requests.

**Classes.** ``interactive`` > ``batch`` > ``background`` (:data:`CLASSES`). A slot that frees goes
to the highest class that has a waiter.

**Fair between keys.** Within a class, waiters are grouped by key (the API key's name; ``None``,
the keyless service, is one key of its own) and served round robin: the key served last goes to
the back of the class's rotation, so a key with 500 queued requests and a key with one alternate
instead of the one waiting behind the 500. Round robin by *requests*, not a deficit by tokens: a
request's tokens are known only after it ran, and the slot it holds is what is scarce here.

**Aging.** A waiter of a lower class that has waited ``aging`` seconds is *aged*: it is served
before every fresher waiter of any class (aged waiters among themselves: oldest first). So under
constant interactive load a batch request waits at most ``aging`` seconds plus the time one slot
takes to free (plus the turns of older aged waiters ahead of it): the documented bound.
``aging = 0`` turns aging off (a lower class then waits as long as higher classes keep coming).

**Reserve.** ``interactive_slots = N`` keeps N of the model's slots for the interactive class: the
lower classes (aged ones too) never hold more than ``slots - N`` at a time. ``N`` is clamped to
``slots - 1``, so the lower classes always keep one.

Everything here runs on the event loop: no lock, one anyio event per waiter.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import anyio

from ...access import PRIORITY_CLASSES, PriorityClass

__all__ = ["CLASSES", "Admission", "PriorityClass", "class_rank"]

#: The classes, highest first: a slot goes to the first one with a waiter.
CLASSES: tuple[PriorityClass, ...] = PRIORITY_CLASSES


def class_rank(cls: str) -> int:
    """0 for interactive, larger for lower classes (ValueError for an unknown name)."""
    return CLASSES.index(cls)


@dataclass(eq=False)
class _Waiter:
    cls: PriorityClass
    key: str | None
    since: float
    granted: bool = False
    event: anyio.Event = field(default_factory=anyio.Event)


class _ClassQueue:
    """One class's waiters: a FIFO per key and the keys' round-robin rotation."""

    def __init__(self) -> None:
        self.by_key: dict[str | None, deque[_Waiter]] = {}
        self.rotation: deque[str | None] = deque()

    def __len__(self) -> int:
        return sum(len(q) for q in self.by_key.values())

    def push(self, w: _Waiter) -> None:
        q = self.by_key.get(w.key)
        if q is None:
            q = self.by_key[w.key] = deque()
            self.rotation.append(w.key)
        q.append(w)

    def pop_next(self) -> _Waiter:
        """The head of the key whose turn it is; that key goes to the back of the rotation."""
        key = self.rotation.popleft()
        q = self.by_key[key]
        w = q.popleft()
        if q:
            self.rotation.append(key)
        else:
            del self.by_key[key]
        return w

    def remove(self, w: _Waiter) -> None:
        q = self.by_key.get(w.key)
        if q is None or w not in q:
            return
        q.remove(w)
        if not q:
            del self.by_key[w.key]
            self.rotation.remove(w.key)

    def oldest(self) -> _Waiter | None:
        heads = [q[0] for q in self.by_key.values()]
        return min(heads, key=lambda w: w.since) if heads else None


class Admission:
    """The slots of one model and the classes waiting for them (see the module docstring)."""

    def __init__(
        self,
        slots: int,
        *,
        interactive_slots: int = 0,
        aging: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.slots = slots
        self.interactive_slots = interactive_slots
        self.aging = aging
        self._clock = clock
        self._queues: dict[PriorityClass, _ClassQueue] = {c: _ClassQueue() for c in CLASSES}
        #: Slots held now, per class (a waiter's class, kept until it gives the slot back).
        self.held: dict[PriorityClass, int] = dict.fromkeys(CLASSES, 0)
        #: Slots held now, per key.
        self.held_by_key: dict[str | None, int] = {}

    # -- what the status shows -------------------------------------------------------------------

    @property
    def in_use(self) -> int:
        return sum(self.held.values())

    def waiting_by_class(self) -> dict[str, int]:
        return {c: len(q) for c, q in self._queues.items()}

    def waiting_by_key(self) -> dict[str, int]:
        """Waiters per key name (``-`` for requests without a key), over every class."""
        out: dict[str, int] = {}
        for q in self._queues.values():
            for key, waiters in q.by_key.items():
                name = key if key is not None else "-"
                out[name] = out.get(name, 0) + len(waiters)
        return out

    def in_flight_by_class(self) -> dict[str, int]:
        return {c: n for c, n in self.held.items()}

    # -- taking and giving -----------------------------------------------------------------------

    def resize(self, slots: int, interactive_slots: int, aging: float) -> None:
        """A reload's new limits: slots held stay held; the next grants follow the new ones."""
        self.slots, self.interactive_slots, self.aging = slots, interactive_slots, aging
        self._dispatch()

    async def take(self, cls: PriorityClass, key: str | None) -> None:
        """Until a slot is this caller's (give it back with :meth:`give`). Cancelled while
        waiting: it leaves the queue (a slot granted in that instant is passed on)."""
        w = _Waiter(cls, key, self._clock())
        self._queues[cls].push(w)
        self._dispatch()
        try:
            await w.event.wait()
        except BaseException:
            if w.granted:
                self.give(cls, key)
            else:
                self._queues[cls].remove(w)
            raise

    def give(self, cls: PriorityClass, key: str | None) -> None:
        """A slot taken with ``(cls, key)`` is free again: the next waiter gets it."""
        self.held[cls] -= 1
        left = self.held_by_key.get(key, 0) - 1
        if left > 0:
            self.held_by_key[key] = left
        else:
            self.held_by_key.pop(key, None)
        self._dispatch()

    # -- the policy ------------------------------------------------------------------------------

    def _lower_cap(self) -> int:
        """Slots the lower classes may hold together (``interactive_slots`` kept back)."""
        reserve = min(max(self.interactive_slots, 0), max(self.slots - 1, 0))
        return self.slots - reserve

    def _dispatch(self) -> None:
        while self.in_use < self.slots:
            w = self._next()
            if w is None:
                return
            self.held[w.cls] += 1
            self.held_by_key[w.key] = self.held_by_key.get(w.key, 0) + 1
            w.granted = True
            w.event.set()

    def _next(self) -> _Waiter | None:
        """The waiter the next free slot goes to, already out of its queue (None: nobody may)."""
        lower_room = self.in_use - self.held["interactive"] < self._lower_cap()
        if lower_room and self.aging > 0:
            now = self._clock()
            aged = [
                w
                for c in CLASSES[1:]
                if (w := self._queues[c].oldest()) is not None and now - w.since >= self.aging
            ]
            if aged:
                w = min(aged, key=lambda x: x.since)
                self._queues[w.cls].remove(w)
                return w
        for c in CLASSES:
            q = self._queues[c]
            if not q.rotation:
                continue
            if c != "interactive" and not lower_room:
                return None
            return q.pop_next()
        return None
