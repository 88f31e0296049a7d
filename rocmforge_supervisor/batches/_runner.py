"""The batch runner: one task inside ``forge serve`` that sends each waiting line of each batch.

It knows no HTTP. A line goes out through ``send`` — the service's own request path (its
middleware and forwarder, in process), as the batch's owner's key, in the ``background`` class —
so a line is admitted, charged, limited and scoped exactly like the same request sent over HTTP:
a model the key may not use is that line's 403, in the error file, and the batch goes on.

A 429 (a full queue, the key's rate limit) or 503 (a model loading or restarting) is not an
answer: the line is sent again after a backoff, until the batch's window ends. Every other answer
is recorded at once (``BatchStore.answer``), so after a restart only the unanswered lines run.
A line that was in flight when the service stopped had no answer recorded: it is sent again.
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from ._store import BatchStore, Line

__all__ = ["BatchRunner", "Send"]

log = logging.getLogger("rocmforge.batches")

#: (owner's key name, endpoint, JSON body, request id) → (HTTP status, response body).
Send = Callable[[str | None, str, bytes, str], Awaitable[tuple[int, bytes]]]

#: Statuses that mean "not now" rather than an answer: the line is retried.
_RETRY = frozenset({429, 503})


class BatchRunner:
    def __init__(
        self,
        store: BatchStore,
        send: Send,
        *,
        concurrency: int,
        poll: float = 5.0,
        retry_initial: float = 0.5,
        retry_max: float = 30.0,
    ) -> None:
        self.store, self.send, self.concurrency = store, send, concurrency
        self.poll, self.retry_initial, self.retry_max = poll, retry_initial, retry_max
        self._wake = anyio.Event()

    def poke(self) -> None:
        """A batch was created or cancelled: look now, not at the next poll."""
        self._wake.set()

    async def run(self, stop: anyio.Event) -> None:
        """Until ``stop`` is set: the batches not yet over, oldest first, one at a time."""
        async with anyio.create_task_group() as tg:

            async def stopper() -> None:
                await stop.wait()
                tg.cancel_scope.cancel()

            tg.start_soon(stopper)
            while True:
                self._wake = anyio.Event()
                try:
                    for data, owner in await anyio.to_thread.run_sync(self.store.active):
                        await self._run_batch(data["id"], owner)
                except Exception:  # a bug or a broken store must not end the service
                    log.exception("the batch runner failed; it tries again in %g s", self.poll)
                with anyio.move_on_after(self.poll):
                    await self._wake.wait()

    async def _current(self, bid: str) -> dict[str, Any]:
        found = await anyio.to_thread.run_sync(self.store.batch, bid)
        assert found is not None
        return found[0]

    async def _run_batch(self, bid: str, owner: str | None) -> None:
        in_flight: set[int] = set()
        limiter = anyio.Semaphore(self.concurrency)
        ended = "completed"
        async with anyio.create_task_group() as tg:
            while True:
                data = await self._current(bid)
                if data["status"] == "cancelling":
                    ended = "cancelled"
                    break
                if time.time() >= data["expires_at"]:
                    ended = "expired"
                    break
                want = self.concurrency * 2 + len(in_flight)
                lines = [
                    ln
                    for ln in await anyio.to_thread.run_sync(self.store.pending, bid, want)
                    if ln.idx not in in_flight
                ]
                if not lines:
                    if not in_flight:
                        break
                    await anyio.sleep(0.05)  # a line in flight; its end may leave others waiting
                    continue
                for ln in lines:
                    await limiter.acquire()
                    in_flight.add(ln.idx)
                    tg.start_soon(self._line, bid, owner, data, ln, limiter, in_flight)
        data = await self._current(bid)
        if ended == "completed":
            data["status"] = "finalizing"
            data["finalizing_at"] = int(time.time())
            await anyio.to_thread.run_sync(self.store.update, data)
        await anyio.to_thread.run_sync(self.store.finish, data, ended, owner)
        log.info("batch %s: %s (%s)", bid, ended, data["request_counts"])

    async def _line(
        self,
        bid: str,
        owner: str | None,
        data: dict[str, Any],
        ln: Line,
        limiter: anyio.Semaphore,
        in_flight: set[int],
    ) -> None:
        try:
            ok, result = await self._answer(bid, owner, data, ln)
            if result is not None:
                await anyio.to_thread.run_sync(lambda: self.store.answer(bid, ln.idx, ok=ok, result=result))
        finally:
            in_flight.discard(ln.idx)
            limiter.release()

    async def _answer(
        self, bid: str, owner: str | None, data: dict[str, Any], ln: Line
    ) -> tuple[bool, dict[str, Any] | None]:
        """(ok, the output or error line); None: the batch ended before it was answered."""
        rid = f"{bid}-{ln.idx}"
        if ln.body.get("stream") is True:
            return False, _error_line(
                ln, rid, "invalid_request", "a batch line cannot stream: leave out stream"
            )
        body = json.dumps(ln.body).encode()
        delay = self.retry_initial
        while True:
            status, content = await self.send(owner, data["endpoint"], body, rid)
            if status not in _RETRY:
                return status == 200, _response_line(ln, rid, status, content)
            if time.time() + delay >= data["expires_at"]:
                return False, None
            await anyio.sleep(delay)
            delay = min(delay * 2, self.retry_max)
            current = await self._current(bid)
            if current["status"] == "cancelling":
                return False, None


def _response_line(ln: Line, rid: str, status: int, content: bytes) -> dict[str, Any]:
    try:
        body: Any = json.loads(content)
    except ValueError:
        body = content.decode("utf-8", "replace")
    return {
        "id": "batch_req_" + secrets.token_hex(12),
        "custom_id": ln.custom_id,
        "response": {"status_code": status, "request_id": rid, "body": body},
        "error": None,
    }


def _error_line(ln: Line, rid: str, code: str, message: str) -> dict[str, Any]:
    return {
        "id": "batch_req_" + secrets.token_hex(12),
        "custom_id": ln.custom_id,
        "response": None,
        "error": {"code": code, "message": message},
    }
