"""Shared fixtures of the gateway tests."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack

import pytest


@pytest.fixture
def closing() -> Iterator[ExitStack]:
    """SDK clients (openai, anthropic, ollama) hold connection pools: enter them here and they
    are closed when the test ends (unclosed sockets are errors under ``filterwarnings = error``)."""
    with ExitStack() as stack:
        yield stack
