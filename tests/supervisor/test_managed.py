"""One model's life under the real Supervisor, with the fake llama-server as its child: start,
serve, crash and back off, open the breaker, replace a hung child, unload on TTL, drain."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import anyio
import httpx
import pytest

from rocmforge_supervisor._errors import ServiceError
from rocmforge_supervisor.config import ForgeConfig
from rocmforge_supervisor.supervisor import EventKind, ModelState
from tests.support.supervised import alive, running, wait_state

pytestmark = pytest.mark.anyio

MakeConfig = Callable[..., ForgeConfig]


async def _stream(base_url: str, key: str | None, path: str = "/v1/chat/completions") -> list[str]:
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    async with (
        httpx.AsyncClient(base_url=base_url, headers={"Authorization": f"Bearer {key}"}) as c,
        c.stream("POST", path, json=body) as r,
    ):
        assert r.status_code == 200 and r.headers["content-type"] == "text/event-stream"
        return [line async for line in r.aiter_lines() if line.startswith("data: ")]


async def test_a_request_starts_the_model_and_streams(make_config: MakeConfig, fake_bin: Path) -> None:
    async with running(make_config({"m": {}}), fake_bin) as sup:
        m = sup.get("m")
        assert m.state == ModelState.UNLOADED
        async with sup.acquire("m") as upstream:
            assert m.state == ModelState.READY and m.in_flight == 1 and upstream.alive()
            lines = await _stream(upstream.base_url, upstream.api_key)
            assert lines[-1] == "data: [DONE]" and len(lines) == 5  # 3 chunks, the finish chunk, [DONE]
            assert m.server is not None
            pid = m.server.pid
        status = m.status()
        assert status.pid == pid and status.devices == ["cpu"] and status.estimated_bytes
    assert m.state == ModelState.STOPPED and pid is not None and not alive(pid)


async def test_crashes_restart_with_doubling_backoff(make_config: MakeConfig, fake_bin: Path) -> None:
    cfg = make_config(
        {"m": {"args": ["--fake-crash-after", "0.1"], "preload": True}},
        restart_backoff_initial=0.05,
        restart_backoff_max=0.2,
    )
    async with running(cfg, fake_bin) as sup, sup.events.subscribe(replay=True) as events:
        restarts: list[tuple[float, float]] = []  # (backoff, when)
        readies: list[float] = []
        with anyio.fail_after(10):
            async for ev in events:
                if ev.kind == EventKind.RESTART:
                    restarts.append((ev.data["backoff"], time.monotonic()))
                elif ev.kind == EventKind.STATE and ev.state == "ready" and restarts:
                    readies.append(time.monotonic())
                if len(readies) == 4:
                    break
    backoffs = [b for b, _ in restarts[:4]]
    assert backoffs == [0.05, 0.1, 0.2, 0.2]
    for (backoff, at), ready_at in zip(restarts, readies, strict=False):
        assert ready_at - at >= backoff * 0.9  # the next start waited its backoff out
    assert sup.get("m").restarts >= 4


async def test_a_crash_loop_opens_the_breaker(make_config: MakeConfig, fake_bin: Path) -> None:
    cfg = make_config({"m": {"args": ["--fake-crash-after", "0"], "preload": True}}, crash_loop_max=3)
    async with running(cfg, fake_bin) as sup:
        m = sup.get("m")
        await wait_state(m, ModelState.FAILED)  # it dies at every start (at load or just after)
        crash_loop = "3 crashes in 300 s; last: llama-server .*exited with code 1"
        with pytest.raises(ServiceError, match=crash_loop):  # the breaker stays open for requests
            async with sup.acquire("m"):
                pass
        assert m.state == ModelState.FAILED and m.failure_kind == "crash_loop" and m.restarts == 2
        assert not m.running
        m.reset()  # forge load / a reload closes the breaker
        assert m.state == ModelState.UNLOADED and m.breaker.crashes == 0


async def test_a_refused_model_fails_at_once(make_config: MakeConfig, fake_bin: Path) -> None:
    async with running(make_config({"m": {"args": ["--fake-refuse"]}}), fake_bin) as sup:
        with pytest.raises(ServiceError, match="not a loadable GGUF"):
            await sup.load("m")
        m = sup.get("m")
        assert m.failure_kind == "invalid_model" and m.restarts == 0


async def test_a_slow_load_is_loading_until_ready(make_config: MakeConfig, fake_bin: Path) -> None:
    async with running(make_config({"m": {"args": ["--fake-load-seconds", "0.3"]}}), fake_bin) as sup:
        m = sup.get("m")
        async with anyio.create_task_group() as tg:
            tg.start_soon(sup.load, "m")
            with anyio.fail_after(5):
                while m.server is None or m.server.port is None or await m.server.health() != 503:  # noqa: ASYNC110
                    await anyio.sleep(0.01)  # polled: the child binds its port with no event to wait on
            assert m.state == ModelState.LOADING
        assert m.state == ModelState.READY and m.load_seconds is not None and m.load_seconds >= 0.3


async def test_a_hung_child_is_killed_and_replaced(make_config: MakeConfig, fake_bin: Path) -> None:
    cfg = make_config({"m": {"preload": True}}, health_interval=0.05, health_failures=2)
    async with running(cfg, fake_bin) as sup:
        m = sup.get("m")
        assert m.server is not None and m.server.pid is not None
        hung = m.server.pid
        os.kill(hung, signal.SIGSTOP)  # fault injection: the child stops answering
        async with sup.events.subscribe() as events:
            with anyio.fail_after(5):
                kinds = [ev.kind async for ev in _until_ready(events)]
        assert EventKind.HANG in kinds and EventKind.CRASH in kinds
        assert m.server is not None and m.server.pid != hung and not alive(hung)
        # Recovered: no present error; the crash is kept as the last one.
        assert m.last_error is None and m.last_crash == "llama-server killed by SIGKILL"
        assert any("(SIGKILL): no answer to /health for 0.1 s" in line for line in (m.last_stderr or []))


async def test_a_hang_is_detected_within_interval_times_failures(
    make_config: MakeConfig, fake_bin: Path
) -> None:
    """The bound users read from the knobs (issue 19, 4): with checks every 1 s and 3 allowed to
    fail, a hang is killed 2-3 s after it began (it depends on where between two checks it began),
    not after 3 × (interval + probe timeout) = 5-6 s as when each probe came on top of the interval.
    The margins are a whole interval wide on each side: not a race with the scheduler."""
    interval, failures = 1.0, 3
    cfg = make_config({"m": {"preload": True}}, health_interval=interval, health_failures=failures)
    async with running(cfg, fake_bin) as sup:
        m = sup.get("m")
        assert m.server is not None and m.server.pid is not None
        async with sup.events.subscribe() as events:
            hung_at = anyio.current_time()
            os.kill(m.server.pid, signal.SIGSTOP)  # fault injection: the child stops answering
            with anyio.fail_after(10):
                async for ev in events:
                    if ev.kind == EventKind.HANG:
                        break
            detected = anyio.current_time() - hung_at
        assert (failures - 1) * interval <= detected <= failures * interval + 1.5, detected


async def _until_ready(events):  # type: ignore[no-untyped-def]
    async for ev in events:
        yield ev
        if ev.kind == EventKind.STATE and ev.state == "ready":
            return


async def test_an_idle_model_unloads_after_its_ttl(make_config: MakeConfig, fake_bin: Path) -> None:
    async with running(make_config({"m": {"ttl": 0.3}}), fake_bin) as sup:
        m = sup.get("m")
        async with sup.acquire("m"):
            assert m.server is not None
            pid = m.server.pid
        released = time.monotonic()
        await wait_state(m, ModelState.STOPPED)
        assert time.monotonic() - released >= 0.3
        assert [e.kind for e in sup.events.history("m")].count(EventKind.TTL) == 1
        assert pid is not None and not alive(pid)


async def test_unload_drains_the_request_in_flight_first(make_config: MakeConfig, fake_bin: Path) -> None:
    cfg = make_config({"m": {"args": ["--fake-token-delay", "0.05", "--fake-chunks", "8"]}})
    async with running(cfg, fake_bin) as sup:
        m = sup.get("m")
        async with anyio.create_task_group() as tg:
            async with sup.acquire("m") as upstream:
                tg.start_soon(m.unload)
                await wait_state(m, ModelState.DRAINING)
                lines = await _stream(upstream.base_url, upstream.api_key)  # served in full meanwhile
                assert m.state == ModelState.DRAINING and upstream.alive()
            await wait_state(m, ModelState.STOPPED)
        assert lines[-1] == "data: [DONE]" and len(lines) == 10  # 8 chunks, the finish chunk, [DONE]
        assert not upstream.alive()


async def test_a_drain_is_bounded(make_config: MakeConfig, fake_bin: Path) -> None:
    async with running(make_config({"m": {}}, drain_timeout=0.2), fake_bin) as sup:
        m = sup.get("m")
        async with sup.acquire("m"):
            started = time.monotonic()
            await m.unload()  # the request never ends: the drain gives up after 0.2 s
            assert 0.2 <= time.monotonic() - started < 3
            assert m.state == ModelState.STOPPED
