"""Fixtures for driving the real Supervisor against the fake llama-server (no compiled binary).

``fake_bin`` (tests/conftest.py) goes in through the supervisor's ``binary`` seam, exactly where
the real binary would. Configs go through ``load_config``, the same
reader ``forge serve`` uses, on the ``no_gpu`` fixture machine unless a test picks another
(tests/support/supervised.py, shared with the in-process gateway tests).
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
    """``make_config({"a": {"args": [...]}, ...}, machine="no_gpu", **supervisor_keys)``."""

    def make(models: dict[str, dict[str, Any]], *, machine: str = "no_gpu", **supervisor: Any) -> ForgeConfig:
        return fake_config(tmp_path, tiny_gguf, models, machine=machine, **supervisor)

    return make
