"""The gateway in-process against the FAKE llama-server (see tests/support/gateway.py)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import pytest

from rocmforge_supervisor.config import ForgeConfig
from tests.support.gateway import Gateway, serving
from tests.support.supervised import fake_config

Serve = Callable[..., AbstractAsyncContextManager[Gateway]]


@pytest.fixture
def serve(tmp_path: Path, tiny_gguf: Path, fake_bin: Path) -> Serve:
    """``async with serve({"m": {"args": ["--fake-…"]}}, server={...}, **supervisor) as gw``: the
    gateway in this loop, with one fake child per model (a model's ``args`` are the fake's knobs).
    ``reload_server``: the ``[server]`` keys that ``POST /api/reload`` finds in forge.toml."""

    def make(
        models: dict[str, dict[str, Any]],
        *,
        server: dict[str, Any] | None = None,
        reload_server: dict[str, Any] | None = None,
        **supervisor: Any,
    ) -> AbstractAsyncContextManager[Gateway]:
        config = fake_config(tmp_path, tiny_gguf, models, server=server, **supervisor)

        def reload_to() -> ForgeConfig:  # forge.toml rewritten with ``reload_server``, then read
            return fake_config(tmp_path, tiny_gguf, models, server=reload_server, **supervisor)

        return serving(config, fake_bin, reload_to=reload_to if reload_server is not None else None)

    return make
