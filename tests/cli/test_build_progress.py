"""`forge build` without a terminal (CI, journald) still says it is alive while it compiles."""

from __future__ import annotations

import io
import time
from typing import cast

import pytest

from rocmforge_supervisor.binaries import BuildResult
from rocmforge_supervisor.binaries._builder import ProgressFn
from rocmforge_supervisor.cli._build import plain_progress


def test_non_tty_build_prints_the_last_step_on_a_heartbeat(monkeypatch: pytest.MonkeyPatch) -> None:
    """The build function here only reports a step and waits: what is tested is the heartbeat,
    which must print even while the build says nothing (one long compile step)."""
    err = io.StringIO()
    monkeypatch.setattr("sys.stderr", err)
    done = object()

    def quiet_build(progress: ProgressFn) -> BuildResult:
        progress(3, 10, "[3/10] Building CXX object ggml/src/ggml.c.o")
        deadline = time.monotonic() + 10
        while err.getvalue().count("\n") < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        return cast(BuildResult, done)

    assert plain_progress(quiet_build, interval=0.05) is done
    lines = err.getvalue().splitlines()
    assert len(lines) >= 2, lines
    assert lines[0].startswith("building llama-server: [3/10] Building CXX object ggml/src/ggml.c.o (")
