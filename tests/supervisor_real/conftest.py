"""Fixtures for driving the real Supervisor against the real llama-server (the compiled binary).

The supervisor tests that need what only the real binary does (``/props``' ``is_sleeping``, a
task loop frozen while ``/health`` answers, prompt batches as progress) live here, so that
tests/supervisor runs against the fake alone. Configs are written and read as there
(tests/support/supervised.py); the binary goes in through the same ``binary`` seam.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rocmforge_supervisor.config import ForgeConfig
from tests.support.supervised import fake_config


@pytest.fixture
def make_config(tmp_path: Path, tiny_gguf: Path) -> Callable[..., ForgeConfig]:
    """``make_config({"a": {"path": ..., "args": [...]}, ...}, machine="no_gpu", **supervisor_keys)``."""

    def make(models: dict[str, dict[str, Any]], *, machine: str = "no_gpu", **supervisor: Any) -> ForgeConfig:
        return fake_config(tmp_path, tiny_gguf, models, machine=machine, **supervisor)

    return make
