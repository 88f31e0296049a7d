"""The progress watchdog on the real llama-server (SmolLM2 at the pin): a wedged decode, its
task-loop thread frozen by ptrace while its HTTP thread keeps answering /health (as in llama.cpp
#27388), is reset; a long prompt in small batches, slower than the stall timeout in all, is not.
The rule itself is tested with a clock of its own in tests/supervisor/test_watchdog.py."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import anyio
import httpx
import pytest

from rocmforge_supervisor.config import ForgeConfig
from rocmforge_supervisor.supervisor import EventKind, ModelState
from rocmforge_supervisor.supervisor.model._watchdog import poll_interval
from tests.support.supervised import running

MakeConfig = Callable[..., ForgeConfig]
REPO = Path(__file__).resolve().parents[2]


def _freeze(pid: int) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.support.freeze", str(pid)], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "frozen"
    return proc


@pytest.mark.anyio
async def test_a_wedged_decode_is_reset_while_health_answers(
    make_config: MakeConfig, llama_server_bin: Path, smollm2_path: Path
) -> None:
    stall = 2.0
    model = {"path": str(smollm2_path), "ctx_size": 2048, "args": ["--threads", "1"]}
    cfg = make_config({"m": {**model, "stall_timeout": stall, "preload": True}})
    freezer: subprocess.Popen[str] | None = None
    async with running(cfg, llama_server_bin) as sup, sup.events.subscribe() as events:
        m = sup.get("m")
        assert m.server is not None
        first_pid = m.server.pid
        assert first_pid is not None
        body = {"prompt": "Once upon a time", "max_tokens": 1500, "ignore_eos": True, "stream": True}
        chunks = 0
        ended_by: str | None = None
        async with sup.acquire("m") as upstream:
            headers = {"Authorization": f"Bearer {upstream.api_key}"}
            async with httpx.AsyncClient(base_url=upstream.base_url, headers=headers, timeout=30) as c:
                try:
                    async with c.stream("POST", "/v1/completions", json=body) as r:
                        async for line in r.aiter_lines():
                            if not line.startswith("data: "):
                                continue
                            chunks += 1
                            if chunks == 1:
                                freezer = await anyio.to_thread.run_sync(_freeze, first_pid)
                                frozen_at = time.monotonic()
                                # The wedge: /health still answers 200 from the HTTP thread.
                                async with httpx.AsyncClient(timeout=3) as probe:
                                    health = await probe.get(f"{upstream.base_url}/health")
                                assert health.status_code == 200
                            if line == "data: [DONE]":
                                ended_by = "done"
                except httpx.HTTPError as exc:
                    ended_by = type(exc).__name__
        assert ended_by != "done", "the frozen stream cannot have finished"
        with anyio.fail_after(stall + 10):
            async for ev in events:
                if ev.kind == EventKind.STALL:
                    reset_after = time.monotonic() - frozen_at
                    break
        # Bound: stall_timeout + one poll interval + a probe timeout (and slack for a loaded box).
        assert reset_after <= stall + poll_interval(stall) + 2.0 + 3.0
        with anyio.fail_after(20):  # replaced through the crash path: a new child, ready
            async for ev in events:
                if ev.kind == EventKind.STATE and ev.state == "ready" and ev.data.get("pid") != first_pid:
                    break
        assert m.state == ModelState.READY and m.server is not None and m.server.pid != first_pid
        assert m.stalls == 1 and m.restarts >= 1
        assert sup.get("m").status().to_json()["stalls"] == 1
    if freezer is not None:
        freezer.wait(timeout=10)  # it saw its tracee die, and left
        assert freezer.stdout is not None
        freezer.stdout.close()


@pytest.mark.anyio
async def test_slow_but_moving_is_not_reset(
    make_config: MakeConfig, llama_server_bin: Path, smollm2_path: Path
) -> None:
    """A long prompt on a real model at one thread, in small batches: each batch is progress, however
    long the request takes in all (several stall timeouts here)."""
    stall = 2.0
    args = ["--threads", "1", "-b", "32", "-ub", "32"]
    cfg = make_config(
        {
            "m": {
                "path": str(smollm2_path),
                "ctx_size": 2048,
                "parallel": 1,
                "args": args,
                "stall_timeout": stall,
                "preload": True,
            }
        }
    )
    # The request alone takes ~15-18 s at one thread here (running()'s default bound is 20 s, for
    # the whole load and request: too tight on a loaded machine).
    async with running(cfg, llama_server_bin, timeout=120) as sup:
        m = sup.get("m")
        prompt = " ".join(["the quick brown fox jumps over the lazy dog"] * 60)
        async with sup.acquire("m") as upstream:
            headers = {"Authorization": f"Bearer {upstream.api_key}"}
            async with httpx.AsyncClient(base_url=upstream.base_url, headers=headers, timeout=60) as c:
                started = time.monotonic()
                r = await c.post("/v1/completions", json={"prompt": prompt, "max_tokens": 16})
                took = time.monotonic() - started
        assert r.status_code == 200, r.text
        assert m.stalls == 0 and m.restarts == 0
        assert took > stall, f"the request took {took:.2f} s: too fast to show anything"
