"""``forge build``: build (or find) llama-server."""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import typer

from ..binaries import (  # the light ``_plan`` only: the build package is lazy
    ACCELS,
    RPC_SERVER_TARGET,
    check_accel,
)
from ._common import console, err_console, get_settings

if TYPE_CHECKING:
    from ..binaries import BinaryInfo, BuildResult, WhisperBuild
    from ..binaries._builder import ProgressFn

__all__ = ["plain_progress", "register", "with_progress"]

_R = TypeVar("_R")


def build(
    accel: str | None = typer.Option(
        None, "--accel", help=f"The accelerator to build for: one of {', '.join(ACCELS)} (default: auto)."
    ),
    # Its old name: scripts and images that still say --backend keep working (not in --help:
    # "backend" is a model's kind, llama / whisper / command / peer).
    backend: str | None = typer.Option(None, "--backend", hidden=True),
    source: Path | None = typer.Option(None, "--source", help="A llama.cpp source tree to build instead."),
    gpu_targets: str | None = typer.Option(
        None, "--gpu-targets", help="HIP GPU_TARGETS, e.g. 'gfx1100;gfx1030' (default: the detected GPUs)."
    ),
    jobs: int | None = typer.Option(
        None, "-j", "--jobs", min=1, help="Parallel compile jobs (default: CPUs)."
    ),
    verbose: bool = typer.Option(False, "-v", "--verbose", help="Stream the compiler output."),
    force: bool = typer.Option(False, "--force", help="Rebuild even when a cached build exists."),
    print_path: bool = typer.Option(
        False, "--print-path", help="Only locate the binary to use and print what it reports."
    ),
    as_json: bool = typer.Option(False, "--json", help="With --print-path: machine-readable output."),
    rpc: bool = typer.Option(
        False,
        "--rpc",
        help="Also build llama.cpp's RPC worker (ggml-rpc-server, for `forge worker`) with an "
        "RPC-capable llama-server, cached under its own key.",
    ),
    portable: bool = typer.Option(
        False,
        "--portable",
        help="Build the CPU part for any x86-64 CPU (run-time ISA dispatch, as llama.cpp's release "
        "images): for container images and caches shared between machines.",
    ),
    whisper: bool = typer.Option(
        False,
        "--whisper",
        help='Build whisper.cpp\'s whisper-server (for backend = "whisper" models) instead of '
        "llama-server, from the pinned whisper.cpp (cached, self-tested).",
    ),
) -> None:
    """Build llama-server from the pinned llama.cpp (cached), or print the one in use."""
    from ..binaries import build_llama_server, locate_llama_server, locate_rpc_server  # start-up time

    chosen = _chosen_accel(accel, backend)
    settings = get_settings()
    if whisper:
        _build_whisper(chosen, gpu_targets, jobs, verbose, force, print_path, as_json, source, rpc, portable)
        return
    if print_path:
        info = locate_llama_server(settings, list_devices=True, rpc=rpc)
        if rpc:
            err_console.print(f"rpc worker: {locate_rpc_server(settings)}", markup=False)
        if as_json:
            console.print_json(json.dumps(info.to_json()))
            return
        console.print(str(info.path), markup=False)
        err_console.print(
            f"version {info.version}, commit {info.commit}, accels: {', '.join(info.accels)} ({info.source})",
            markup=False,
        )
        if info.selftest is not None:
            err_console.print(f"self-test: {info.selftest.detail}", markup=False)
        _print_gpu_notes(info)
        return
    targets = [t for t in gpu_targets.replace(",", ";").split(";") if t] if gpu_targets else None

    def build(progress: ProgressFn) -> BuildResult:
        return build_llama_server(
            settings,
            accel=chosen,
            source=source,
            gpu_targets=targets,
            jobs=jobs,
            force=force,
            progress=progress,
            rpc=rpc,
            portable=portable,
        )

    _sigterm_interrupts()  # a stopped build takes its compilers with it (see _run_plan)
    result = with_progress("llama-server", build, verbose=verbose)
    console.print(str(result.info.path), markup=False)
    what = "cached" if result.cached else f"built in {result.seconds:.0f} s"
    err_console.print(
        f"llama-server {result.info.version} (commit {result.info.commit}), {result.key}, {what}",
        markup=False,
    )
    if rpc:
        err_console.print(f"rpc worker: {result.info.path.parent / RPC_SERVER_TARGET}", markup=False)
    if result.info.selftest is not None:
        err_console.print(f"self-test: {result.info.selftest.detail}", markup=False)
    _print_gpu_notes(result.info)


def _chosen_accel(accel: str | None, backend: str | None) -> str:
    """``--accel``, or ``--backend``, its old name (hidden, still accepted); ``auto`` when neither
    is given. Both given must agree: which one wins would be a guess."""
    from .._errors import UsageError

    if accel is not None and backend is not None and accel != backend:
        raise UsageError(
            f"--accel {accel} and --backend {backend} disagree",
            hint="--backend is the old name of --accel: give --accel only",
        )
    chosen = accel if accel is not None else backend if backend is not None else "auto"
    check_accel(chosen)  # before anything, --print-path too (it would ignore it)
    return chosen


def _print_gpu_notes(info: BinaryInfo) -> None:
    """Whether a GPU build has computed on its GPU here, and the GPU backends it has that see no
    device (a HIP build on a machine without an AMD GPU serves on the CPU: the line says why)."""
    if info.gpu_run is not None:
        err_console.print(f"gpu: {info.gpu_run.detail}", markup=False)
    for why in info.unused_gpu_backends:
        err_console.print(f"gpu backend unused, serving on the CPU: {why}", markup=False)


def _build_whisper(
    accel: str,
    gpu_targets: str | None,
    jobs: int | None,
    verbose: bool,
    force: bool,
    print_path: bool,
    as_json: bool,
    source: Path | None,
    rpc: bool,
    portable: bool,
) -> None:
    """``forge build --whisper``: whisper-server, or with ``--print-path`` the one models would use."""
    from .._errors import UsageError
    from ..binaries import build_whisper_server, locate_whisper_server

    for name, given in (("--source", source is not None), ("--rpc", rpc), ("--portable", portable)):
        if given:
            raise UsageError(
                f"{name} does not apply to --whisper",
                hint=f"drop {name}: whisper-server builds from its pinned source",
            )
    settings = get_settings()
    if print_path:
        path = locate_whisper_server(settings)
        if as_json:
            console.print_json(json.dumps({"path": str(path)}))
        else:
            console.print(str(path), markup=False)
        return
    targets = [t for t in gpu_targets.replace(",", ";").split(";") if t] if gpu_targets else None
    _sigterm_interrupts()

    def build(progress: ProgressFn) -> WhisperBuild:
        return build_whisper_server(
            settings, accel=accel, gpu_targets=targets, jobs=jobs, force=force, progress=progress
        )

    result = with_progress("whisper-server", build, verbose=verbose)
    console.print(str(result.path), markup=False)
    what = "cached" if result.cached else f"built in {result.seconds:.0f} s"
    err_console.print(
        f"whisper-server (whisper.cpp commit {result.commit[:12]}), {result.key}, {what}", markup=False
    )
    if not result.cached:
        err_console.print(f"self-test: {result.detail}", markup=False)


def _sigterm_interrupts() -> None:
    """SIGTERM (systemd, `kill`, a CI runner) ends the build like Ctrl-C: as an exception in the
    main thread, so the compiler group is killed and no staging directory stays behind. Python's
    default for SIGTERM is to die at once, which would leave cmake, ninja and cc1plus running."""
    import signal

    def interrupt(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, interrupt)


def with_progress(
    program: str, build: Callable[[ProgressFn], _R], *, verbose: bool = False, interval: float = 20.0
) -> _R:
    """Run ``build`` showing how far it is, the same way for every program forge compiles: each
    compiler line with ``-v``, a bar on a terminal, a line at least every 20 s otherwise (a build
    takes minutes; silence looks like a hang)."""
    if verbose:
        return build(lambda done, total, line: err_console.print(line, markup=False, highlight=False))
    if not err_console.is_terminal:
        return plain_progress(build, interval, program=program)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn(f"[bold]building {program}[/]"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.description}", style="dim", markup=False),
        console=err_console,
        transient=True,
    ) as bar:
        task = bar.add_task("configuring", total=None)

        def on_progress(done: int | None, total: int | None, line: str) -> None:
            if done is not None and total is not None:
                bar.update(task, completed=done, total=total, description=line.split("] ", 1)[-1][:60])

        return build(on_progress)


def plain_progress(
    build: Callable[[ProgressFn], _R], interval: float = 20.0, *, program: str = "llama-server"
) -> _R:
    """Not a terminal (CI, journald): a bar would print nothing for the whole build (minutes), so a
    line with the last ``[n/m]`` step goes out at least every ``interval`` seconds instead."""
    state = ["configuring"]
    start = time.monotonic()
    stop = threading.Event()

    def on_progress(done: int | None, total: int | None, line: str) -> None:
        if done is not None and total is not None:
            state[0] = f"[{done}/{total}] {line.split('] ', 1)[-1][:80]}"

    def beat() -> None:
        while not stop.wait(interval):
            elapsed = time.monotonic() - start
            print(f"building {program}: {state[0]} ({elapsed:.0f} s)", file=sys.stderr, flush=True)

    ticker = threading.Thread(target=beat, name="build-progress", daemon=True)
    ticker.start()
    try:
        return build(on_progress)
    finally:
        stop.set()
        ticker.join()


def register(app: typer.Typer) -> None:
    app.command("build")(build)
