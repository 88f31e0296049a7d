"""The gateway served in-process: the app ``forge serve`` builds (``service._server._gateway``:
the same state, keys, activity store and uvicorn settings), on a socket the OS picks, in the
test's own event loop, in front of a real Supervisor whose children are the FAKE llama-server
(tests/support/fake_llama_server.py). A request goes through uvicorn, the middleware, the route,
the supervisor's queue and a real HTTP hop to a real child process — only the model is fake — so
streaming, keep-alive comments and a client that leaves behave as they do in production, in
milliseconds. The real-process tests under tests/gateway prove the fake tells the truth.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import anyio
import httpx

from rocmforge_supervisor.config import ForgeConfig
from rocmforge_supervisor.service import GatewayState
from rocmforge_supervisor.service.ops._server import _bind, _gateway, _reloader
from rocmforge_supervisor.supervisor import ManagedModel, Supervisor
from tests.support.supervised import running

__all__ = ["Gateway", "poll", "serving", "tasks"]


@dataclass
class Gateway:
    sup: Supervisor
    state: GatewayState
    url: str
    client: httpx.AsyncClient

    def model(self, name: str) -> ManagedModel:
        return self.sup.models[name]

    def child_log(self, name: str) -> str:
        """What the model's child printed (the supervisor writes it to ``logs/NAME.log``)."""
        path = self.sup.log_dir / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""


async def poll(cond: Callable[[], object], *, timeout: float = 5.0, what: str = "condition") -> object:
    """Until ``cond()`` is true, checked every 10 ms, for at most ``timeout`` seconds."""
    last: object = None
    with anyio.move_on_after(timeout):
        while not (last := cond()):  # noqa: ASYNC110 (a condition on anything: no event to wait on)
            await anyio.sleep(0.01)
        return last
    raise AssertionError(f"timed out after {timeout} s waiting for {what} (last: {last!r})")


@asynccontextmanager
async def serving(
    config: ForgeConfig,
    fake_bin: Path,
    *,
    reload_to: Callable[[], ForgeConfig] | None = None,
    timeout: float = 20,
) -> AsyncIterator[Gateway]:
    """The supervisor and its gateway, serving until the block ends; then the gateway is shut
    down (uvicorn's own shutdown), the upstream pool and activity store closed, every child stopped.
    ``reload_to``: what ``POST /api/reload`` loads (the service's reloader, as SIGHUP runs it)."""
    async with running(config, fake_bin, timeout=timeout) as sup:
        state, uv = _gateway(config, sup, None, None)
        if reload_to is not None:
            state.reload = _reloader(sup, state, reload_to, None)
        sock = _bind("127.0.0.1", 0)
        host, port = sock.getsockname()[:2]
        url = f"http://{host}:{port}"
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(uv.serve, [sock])
                await poll(lambda: uv.started, what="uvicorn to start")
                async with httpx.AsyncClient(base_url=url, timeout=10) as client:
                    yield Gateway(sup, state, url, client)
                state.closing.set()
                uv.should_exit = True
        finally:
            sock.close()
            with anyio.CancelScope(shield=True):
                await state.upstream.aclose()
                await state.streams.aclose()
                if state.recorder.store is not None:
                    await anyio.to_thread.run_sync(state.recorder.store.close)


def tasks() -> set[asyncio.Task[object]]:
    """The event loop's tasks now (for the no-leaked-task checks)."""
    return set(asyncio.all_tasks())
