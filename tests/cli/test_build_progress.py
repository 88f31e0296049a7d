"""`forge build` without a terminal (CI, journald) still says it is alive while it compiles, and
its options reach the build they name (``--accel``, and ``--backend``, its old name)."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest
from typer.testing import CliRunner

from rocmforge_supervisor import binaries
from rocmforge_supervisor._errors import UsageError
from rocmforge_supervisor.binaries import BuildResult
from rocmforge_supervisor.binaries._builder import ProgressFn, job_for
from rocmforge_supervisor.binaries._recipe import Job
from rocmforge_supervisor.cli import _build
from rocmforge_supervisor.cli._build import plain_progress, with_progress
from rocmforge_supervisor.cli.main import app
from rocmforge_supervisor.config import ForgeSettings, get_settings

FORGE = [sys.executable, "-m", "rocmforge_supervisor.cli"]


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


class _Planned(Exception):
    """Raised by the stand-in builder once it has the build planned: nothing is compiled."""


@pytest.fixture
def planned(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[list[tuple[str, str, Job]]]:
    """``forge build`` with the builder replaced by one that only plans: each run adds what it
    was asked to build (which program, the accel as given, the resolved job) and stops there."""
    monkeypatch.setenv("FORGE_CACHE_DIR", str(tmp_path / "cache"))
    get_settings.cache_clear()
    seen: list[tuple[str, str, Job]] = []

    def plan(program: str, settings: ForgeSettings, accel: str, **kw: object) -> None:
        targets = cast("list[str] | None", kw["gpu_targets"])
        job = job_for(settings, accel, targets, jobs=None, progress=None, force=False)
        seen.append((program, accel, job))
        raise _Planned

    def llama(settings: ForgeSettings, *, accel: str, **kw: object) -> None:
        plan("llama-server", settings, accel, **kw)

    def whisper(settings: ForgeSettings, *, accel: str, **kw: object) -> None:
        plan("whisper-server", settings, accel, **kw)

    monkeypatch.setattr(binaries, "build_llama_server", llama)
    monkeypatch.setattr(binaries, "build_whisper_server", whisper)
    monkeypatch.setattr(_build, "_sigterm_interrupts", lambda: None)  # not in pytest's own process
    yield seen
    get_settings.cache_clear()


@pytest.mark.parametrize("whisper", [False, True], ids=["llama-server", "whisper-server"])
def test_accel_and_its_old_name_backend_plan_the_same_build(
    planned: list[tuple[str, str, Job]], whisper: bool
) -> None:
    """``--accel`` names the accelerator; ``--backend``, the name it had before, still works
    (scripts and images use it), alone or beside an ``--accel`` that agrees; neither is ``auto``."""
    extra = ["--whisper"] if whisper else []
    for args in (
        ["--accel", "vulkan"],
        ["--backend", "vulkan"],
        ["--accel", "vulkan", "--backend", "vulkan"],
        [],
    ):
        result = CliRunner().invoke(app, ["build", *args, *extra])
        assert isinstance(result.exception, _Planned), (args, result.output, result.exception)
    program = "whisper-server" if whisper else "llama-server"
    assert [(p, accel) for p, accel, _ in planned] == [(program, "vulkan")] * 3 + [(program, "auto")]
    vulkan = [job for _, _, job in planned[:3]]
    assert vulkan[0].accel == "vulkan" and vulkan[0].targets == ()
    assert vulkan == [vulkan[0]] * 3


def test_help_names_accel_only() -> None:
    """``backend`` is a model's kind (llama, whisper, command, peer): the old option is hidden."""
    result = CliRunner().invoke(app, ["build", "--help"], env={"COLUMNS": "250", "NO_COLOR": "1"})
    assert result.exit_code == 0, result.output
    assert "--accel" in result.output and "The accelerator to build for: one of auto," in result.output
    assert "--backend" not in result.output


def test_accel_and_backend_that_disagree_are_refused(tmp_path: Path) -> None:
    """Which of the two would win is a guess: the real entry point refuses the pair in one line,
    before anything is looked up or built."""
    env = dict(os.environ, FORGE_CACHE_DIR=str(tmp_path / "cache"))
    r = subprocess.run(
        [*FORGE, "build", "--accel", "hip", "--backend", "cpu"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert "--accel hip and --backend cpu disagree" in lines[0], lines[0]
    assert "Traceback" not in r.stderr and not r.stdout
    assert not (tmp_path / "cache" / "builds").exists()
    # An --accel given as auto is given too: --backend cpu beside it is still a conflict.
    result = CliRunner().invoke(app, ["build", "--accel", "auto", "--backend", "cpu"])
    assert isinstance(result.exception, UsageError), result.output
    assert str(result.exception).startswith("--accel auto and --backend cpu disagree")


@pytest.mark.parametrize("args", [["--accel", "bogus"], ["--backend", "bogus"]])
@pytest.mark.parametrize("print_path", [False, True])
def test_an_unknown_accel_is_refused_with_or_without_print_path(
    tmp_path: Path, args: list[str], print_path: bool
) -> None:
    """--print-path only locates the binary in use: it would have ignored the value, exit 0."""
    env = dict(os.environ, FORGE_CACHE_DIR=str(tmp_path / "cache"))
    r = subprocess.run(
        [*FORGE, "build", *args, *(["--print-path"] if print_path else [])],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == (
        "error: unknown accel 'bogus' — use --accel with one of: auto, hip, cuda, vulkan, cpu"
    ), r.stderr
    assert not r.stdout and not (tmp_path / "cache" / "builds").exists()
