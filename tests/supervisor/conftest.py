"""Fixtures for driving the real Supervisor against the fake llama-server (no compiled binary).

``fake_bin`` (tests/conftest.py) goes in through the supervisor's ``binary`` seam, exactly where
the real binary would. Configs go through ``load_config``, the same
reader ``forge serve`` uses, on the ``no_gpu`` fixture machine unless a test picks another.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from rocmforge_supervisor.config import ForgeConfig, ForgeSettings, load_config
from rocmforge_supervisor.supervisor import ManagedModel, ModelState, Supervisor
from tests.hardware.conftest import FIXTURES, machine_settings

#: Fast supervision for tests: every timer in tenths of a second.
FAST = {
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
    return str(value)


@pytest.fixture
def make_config(tmp_path: Path, tiny_gguf: Path) -> Callable[..., ForgeConfig]:
    """``make_config({"a": {"args": [...]}, ...}, machine="no_gpu", **supervisor_keys)``."""

    def make(models: dict[str, dict[str, Any]], *, machine: str = "no_gpu", **supervisor: Any) -> ForgeConfig:
        lines = ["[server]", f'state_dir = "{tmp_path / "state"}"', "", "[supervisor]"]
        lines += [f"{k} = {_toml(v)}" for k, v in {**FAST, **supervisor}.items()]
        for name, keys in models.items():
            lines += ["", f"[models.{name}]", f'path = "{keys.get("path", tiny_gguf)}"']
            lines += [f"{k} = {_toml(v)}" for k, v in keys.items() if k != "path"]
        path = tmp_path / "forge.toml"
        path.write_text("\n".join(lines) + "\n")
        settings: ForgeSettings = machine_settings(FIXTURES / machine, state_dir=tmp_path / "state")
        return load_config(path, settings, env={})

    return make


@asynccontextmanager
async def running(config: ForgeConfig, fake_bin: Path) -> AsyncIterator[Supervisor]:
    """The Supervisor, run as ``forge serve`` runs it; cancelled (and so stopped) at the end."""
    with anyio.fail_after(20):
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
