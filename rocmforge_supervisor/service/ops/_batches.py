"""The Batch API's store and runner, opened with the service (``<state_dir>/batches``)."""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Awaitable, Callable

from starlette.types import ASGIApp

from ...batches import BatchRunner, BatchStore
from ...config import ForgeConfig
from ..core._state import GatewayState
from ..proxy._batch_api import asgi_sender

__all__ = ["open_batches"]

log = logging.getLogger("rocmforge.service")


async def _nothing() -> None:
    return None


def open_batches(config: ForgeConfig, state: GatewayState, app: ASGIApp) -> Callable[[], Awaitable[None]]:
    """The store and the runner on ``state`` (the runner sends into ``app``, the service's own
    request path); returns what closes them. A store that cannot be opened is logged, and the
    Batch API answers 503 saying so: the rest of the service serves."""
    try:
        store = BatchStore(config.state_dir / "batches")
    except (OSError, sqlite3.Error) as exc:
        log.error("the Batch API is off: %s cannot be used: %s", config.state_dir / "batches", exc)
        return _nothing
    send, client = asgi_sender(app, state)
    state.batches = store
    state.batch_runner = BatchRunner(store, send, concurrency=config.server.batch_concurrency)

    async def close() -> None:
        await client.aclose()
        store.close()

    return close
