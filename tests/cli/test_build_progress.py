"""`forge build` without a terminal (CI, journald) still says it is alive while it compiles."""

from __future__ import annotations

import io
import time
from typing import cast

import pytest

from rocmforge_supervisor.binaries import BuildResult
from rocmforge_supervisor.binaries._builder import ProgressFn
from rocmforge_supervisor.cli._build import plain_progress, with_progress


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


@pytest.mark.parametrize("program", ["llama-server", "whisper-server"])
def test_every_program_forge_compiles_shows_its_progress(
    monkeypatch: pytest.MonkeyPatch, program: str
) -> None:
    """``forge build --whisper`` printed nothing for minutes: each build goes through the one
    progress display, named for what it compiles."""
    err = io.StringIO()
    monkeypatch.setattr("sys.stderr", err)

    def quiet_build(progress: ProgressFn) -> str:
        progress(5, 40, "[5/40] Building CXX object src/whisper.cpp.o")
        deadline = time.monotonic() + 10
        while err.getvalue().count("\n") < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        return "built"

    assert with_progress(program, quiet_build, interval=0.05) == "built"
    first = err.getvalue().splitlines()[0]
    assert first.startswith(f"building {program}: [5/40] Building CXX object src/whisper.cpp.o ("), first
