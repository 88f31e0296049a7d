"""A child that is busy but makes no progress is stalled, whatever ``/health`` says.

llama-server answers ``/health`` (and, measured at the pin, ``/slots`` and ``/metrics`` too) from
its HTTP threads, so a decode that wedges (a GPU kernel that never returns, llama.cpp #27388,
#13281) leaves every route a supervisor polls at 200 while each request hangs. Only progress
tells: the signals read here are, per processing slot of ``/slots``, ``n_decoded`` (moves with
every generated token) and ``n_prompt_tokens_processed`` (moves with every prompt batch), with the
slot's task id (a new request is progress too). ``llamacpp:tokens_predicted_total`` is not used: it
moves only when a request ends. A ``/slots`` that does not answer is no progress.

The rule: while forge has requests in flight at the child, if that signature has not changed for
``stall_timeout`` seconds, the child is stalled. One prompt batch of a long prompt on a slow CPU
can take seconds with no visible change, so the timeout must exceed the slowest single step; the
default (120 s) does, by far, for the models a CPU serves. Idle time never counts.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

__all__ = ["ProgressWatch", "poll_interval", "slots_signature"]

Signature = tuple[tuple[int, int, int, int], ...]


def slots_signature(slots: object) -> Signature | None:
    """The progress counters of the processing slots in a ``/slots`` answer (None: unreadable)."""
    if not isinstance(slots, Sequence):
        return None
    out: list[tuple[int, int, int, int]] = []
    for slot in slots:
        if not isinstance(slot, Mapping) or not slot.get("is_processing"):
            continue
        next_token = slot.get("next_token")
        decoded = 0
        if isinstance(next_token, Sequence) and next_token and isinstance(next_token[0], Mapping):
            decoded = _int(next_token[0].get("n_decoded"))
        elif isinstance(next_token, Mapping):
            decoded = _int(next_token.get("n_decoded"))
        out.append(
            (
                _int(slot.get("id")),
                _int(slot.get("id_task")),
                decoded,
                _int(slot.get("n_prompt_tokens_processed")),
            )
        )
    return tuple(sorted(out))


def _int(value: object) -> int:
    return value if isinstance(value, int) else 0


def poll_interval(stall_timeout: float) -> float:
    """A few looks per timeout (a stall is seen within timeout + one interval), at most every 5 s."""
    return min(5.0, max(0.1, stall_timeout / 4))


@dataclass
class ProgressWatch:
    """The watchdog's memory between polls; pure, with an injectable clock (tested in ms)."""

    timeout: float
    clock: Callable[[], float] = time.monotonic
    last_progress: float = field(init=False)
    _last: Signature | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.last_progress = self.clock()

    def observe(self, busy: bool, signature: Signature | None) -> bool:
        """One poll: ``busy`` (forge has requests in flight at the child), the ``/slots`` signature
        (None: no answer). True when the child is stalled."""
        now = self.clock()
        if not busy:
            self.last_progress = now
            self._last = None
            return False
        if signature is not None and signature != self._last:
            if self._last is not None or signature:
                self.last_progress = now
            self._last = signature
        return now - self.last_progress >= self.timeout

    @property
    def stalled_for(self) -> float:
        return self.clock() - self.last_progress
