"""Per-key limits: requests in the last minute and tokens in the last day, as sliding windows.

In memory, on the event loop (no lock: one thread asks and adds); the daily tokens are seeded
from the activity log at start, so a restart does not hand a key a fresh day.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

from .._errors import RateLimited
from ._keys import Key

__all__ = ["Limiter"]

_MINUTE = 60.0
_DAY = 86400.0


class Limiter:
    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._requests: dict[str, deque[float]] = {}
        self._tokens: dict[str, deque[tuple[float, int]]] = {}
        self._token_sums: dict[str, int] = {}

    def seed(self, tokens: dict[str, list[tuple[float, int]]]) -> None:
        """Each key's (time, tokens) of the last day, from the activity log."""
        for name, entries in tokens.items():
            for when, n in entries:
                self._tokens.setdefault(name, deque()).append((when, n))
                self._token_sums[name] = self._token_sums.get(name, 0) + n

    def admit(self, key: Key) -> None:
        """Count one request of ``key``, or :class:`RateLimited` (with when to retry) if it is over
        a limit. A refused request does not count."""
        now = self._clock()
        if key.tokens_per_day is not None:
            used = self._tokens_used(key.name, now)
            if used >= key.tokens_per_day:
                window = self._tokens[key.name]
                # The day frees up as the oldest requests age out; a conservative wait: the oldest's.
                retry = window[0][0] + _DAY - now if window else _DAY
                raise RateLimited(
                    f"the API key {key.name!r} used {used} of its {key.tokens_per_day} tokens per day",
                    retry_after=max(1.0, retry),
                    hint="retry after the Retry-After seconds, or raise tokens_per_day in [[server.keys]]",
                )
        if key.requests_per_minute is not None:
            times = self._requests.setdefault(key.name, deque())
            while times and times[0] <= now - _MINUTE:
                times.popleft()
            if len(times) >= key.requests_per_minute:
                raise RateLimited(
                    f"the API key {key.name!r} is over its {key.requests_per_minute} requests per minute",
                    retry_after=max(1.0, times[0] + _MINUTE - now),
                    hint="retry after the Retry-After seconds, or raise requests_per_minute in [[server.keys]]",
                )
            times.append(now)

    def add_tokens(self, name: str, tokens: int) -> None:
        """Tokens a finished request of key ``name`` used (prompt + completion)."""
        if tokens <= 0:
            return
        self._tokens.setdefault(name, deque()).append((self._clock(), tokens))
        self._token_sums[name] = self._token_sums.get(name, 0) + tokens

    def _tokens_used(self, name: str, now: float) -> int:
        window = self._tokens.get(name)
        if not window:
            return 0
        while window and window[0][0] <= now - _DAY:
            self._token_sums[name] -= window.popleft()[1]
        return self._token_sums.get(name, 0)
