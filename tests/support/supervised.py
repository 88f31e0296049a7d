"""The real Supervisor driven against the FAKE llama-server (tests/support/fake_llama_server.py),
in the test's own event loop: the config written as forge.toml and read by ``load_config`` (the
reader ``forge serve`` uses), the supervisor run as ``forge serve`` runs it, and waits on a model's
state with a deadline. Shared by the supervisor tests and the in-process gateway tests.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
from anyio.streams.memory import MemoryObjectReceiveStream

from rocmforge_supervisor.config import ForgeConfig, ForgeSettings, load_config
from rocmforge_supervisor.supervisor import Event, EventKind, ManagedModel, ModelState, Supervisor
from tests.hardware.conftest import FIXTURES, machine_settings

__all__ = ["FAKE_TIMERS", "alive", "child_post", "fake_config", "running", "sleep_event", "wait_state"]

#: Supervision timers for a fake child (it starts in milliseconds): every timer in tenths of a
#: second. A real `forge serve` in tests takes ``tests.support.service.FAST`` instead.
FAKE_TIMERS: dict[str, Any] = {
    "restart_backoff_initial": 0.05,
    "restart_backoff_max": 0.2,
    "crash_loop_max": 20,
    "crash_loop_window": 300,
    "health_interval": 5,
    "health_failures": 3,
    "load_stall_timeout": 10,
    "stop_timeout": 2,
    "drain_timeout": 5,
}


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):  # an inline table ([models.X.variants] and the like)
        return "{" + ", ".join(f'"{k}" = {_toml(v)}' for k, v in value.items()) + "}"
    return str(value)


def fake_config(
    folder: Path,
    default_model: Path,
    models: dict[str, dict[str, Any]],
    *,
    machine: str = "no_gpu",
    server: dict[str, Any] | None = None,
    groups: dict[str, dict[str, Any]] | None = None,
    peers: dict[str, dict[str, Any]] | None = None,
    **supervisor: Any,
) -> ForgeConfig:
    """``folder/forge.toml`` with ``[server]`` (its state in ``folder/state``, plus ``server``; a
    list of tables, such as ``keys``, as ``[[server.keys]]``),
    ``[supervisor]`` (:data:`FAKE_TIMERS`, plus ``supervisor``), one ``[models.NAME]`` per entry
    (``path`` defaults to ``default_model``) and one ``[groups.NAME]`` per ``groups`` entry (``[peers.NAME]`` per ``peers`` entry), loaded on the ``machine`` fixture's hardware."""
    server = server or {}
    tables = {k: v for k, v in server.items() if isinstance(v, list) and v and isinstance(v[0], dict)}
    lines = ["[server]", f'state_dir = "{folder / "state"}"']
    lines += [f"{k} = {_toml(v)}" for k, v in server.items() if k not in tables]
    for key, rows in tables.items():  # [[server.keys]] and the like, after the plain keys
        for row in rows:
            lines += [f"[[server.{key}]]", *(f"{k} = {_toml(v)}" for k, v in row.items())]
    lines += ["", "[supervisor]"]
    lines += [f"{k} = {_toml(v)}" for k, v in {**FAKE_TIMERS, **supervisor}.items()]
    for name, keys in models.items():
        lines += ["", f"[models.{name}]", f'path = "{keys.get("path", default_model)}"']
        lines += [f"{k} = {_toml(v)}" for k, v in keys.items() if k != "path"]
    for name, keys in (groups or {}).items():
        lines += ["", f"[groups.{name}]", *(f"{k} = {_toml(v)}" for k, v in keys.items())]
    for name, keys in (peers or {}).items():
        lines += ["", f"[peers.{name}]", *(f"{k} = {_toml(v)}" for k, v in keys.items())]
    path = folder / "forge.toml"
    folder.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    settings: ForgeSettings = machine_settings(FIXTURES / machine, state_dir=folder / "state")
    return load_config(path, settings, env={})


@asynccontextmanager
async def running(config: ForgeConfig, fake_bin: Path, timeout: float = 20) -> AsyncIterator[Supervisor]:
    """The Supervisor, run as ``forge serve`` runs it; cancelled (and so stopped) at the end."""
    with anyio.fail_after(timeout):
        async with anyio.create_task_group() as tg:
            sup = await tg.start(Supervisor(config, binary=fake_bin).run)
            await sup.ready.wait()  # preloads settled
            try:
                yield sup
            finally:
                tg.cancel_scope.cancel()


async def wait_state(m: ManagedModel, *states: ModelState, timeout: float = 5.0) -> ModelState:
    """Until the model is in one of ``states`` (polls its change event, with a deadline)."""
    with anyio.fail_after(timeout):
        while m.state not in states:
            await m.changed()
    return m.state


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def sleep_event(events: MemoryObjectReceiveStream[Event], sleeping: bool, timeout: float) -> None:
    """Wait for a model's SLEEP event with ``sleeping`` (``sleep_idle``: the child freed or took
    back its model)."""
    with anyio.fail_after(timeout):
        async for ev in events:
            if ev.kind == EventKind.SLEEP and ev.data["sleeping"] is sleeping:
                return


async def child_post(sup: Supervisor, name: str, path: str, body: dict[str, object]) -> httpx.Response:
    """POST straight to model ``name``'s child, holding an admission slot as the gateway does."""
    async with sup.acquire(name) as up:
        headers = {"Authorization": f"Bearer {up.api_key}"}
        async with httpx.AsyncClient(base_url=up.base_url, headers=headers, timeout=60) as c:
            return await c.post(path, json=body)
