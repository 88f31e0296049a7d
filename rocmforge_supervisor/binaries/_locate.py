"""Finding a llama-server to run, and asking it what it is.

Locate order, for every command that needs the binary (:func:`._recipe.locate`, the one order of
every program): ``FORGE_LLAMA_SERVER`` (or a config path) → the cached build for the pinned commit
(preferring GPU accels) → ``llama-server`` on PATH.
Each candidate is checked by running it with ``--version``, so a broken or foreign file is skipped
with a reason rather than failing a load later, and then by its self-test (:mod:`._selftest`): one
real completion on this CPU, once per binary, so a build that crashes here is never handed a model.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .._argv import probe_argv
from .._errors import BinaryNotFound
from ..config import ForgeSettings
from ..hardware import ListedDevice, parse_device_list
from ._gpurun import GpuRun, backend_init_failures
from ._plan import RPC_SERVER_TARGET
from ._recipe import LLAMA, cached_for_this_cpu, locate
from ._selftest import SelfTest, proven

__all__ = [
    "BackendLog",
    "BinaryInfo",
    "ListedDevice",
    "build_info_of",
    "cached_builds",
    "child_flags",
    "locate_llama_server",
    "locate_rpc_server",
    "parse_backend_log",
    "parse_device_list",
    "probe_binary",
    "selftest_of",
]

_LOADED_RE = re.compile(r"load_backend: loaded (\S+) backend from (\S+)")
_LOAD_FAILED_RE = re.compile(r"load_backend: failed to load (\S+): (.+?)\s*$")
_UNSUPPORTED_RE = re.compile(r"load_backend: backend (\S+) is not supported on this system")


@dataclass(frozen=True)
class BackendLog:
    """What a llama-server whose ggml backends are loadable libraries (``libggml-hip.so``,
    ``libggml-cpu-haswell.so``: GGML_BACKEND_DL, as distributions and llama.cpp's release images
    ship it) said about them while listing its devices. Empty for a self-contained build."""

    loaded: tuple[tuple[str, str], ...] = ()  # (backend name, library path): ("ROCm", "/usr/lib/…")
    failed: tuple[tuple[str, str], ...] = ()  # (library path, the loader's error)
    unsupported: tuple[str, ...] = ()  # libraries whose score said "not on this CPU"
    init_failures: tuple[str, ...] = ()  # "ROCm: no ROCm-capable device is detected"
    installed: tuple[str, ...] = ()  # the backend libraries beside the loaded ones

    def to_json(self) -> dict[str, object]:
        return {
            "installed": list(self.installed),
            "loaded": [{"backend": name, "path": path} for name, path in self.loaded],
            "failed": [{"path": path, "error": error} for path, error in self.failed],
            "unsupported": list(self.unsupported),
            "init_failures": list(self.init_failures),
        }


def parse_backend_log(text: str) -> BackendLog:
    """The backend-loading lines of llama-server's start (``load_backend: loaded ROCm backend
    from …``, ``ggml_cuda_init: failed to initialize ROCm: …``). The installed libraries are
    listed from the loaded ones' directories (where ggml searched)."""
    lines = text.splitlines()
    loaded = tuple(dict.fromkeys((m[1], m[2]) for line in lines if (m := _LOADED_RE.search(line))))
    failed = tuple(dict.fromkeys((m[1], m[2]) for line in lines if (m := _LOAD_FAILED_RE.search(line))))
    unsupported = tuple(dict.fromkeys(m[1] for line in lines if (m := _UNSUPPORTED_RE.search(line))))
    dirs = dict.fromkeys(
        Path(p).parent for p in (*(p for _, p in loaded), *(p for p, _ in failed), *unsupported)
    )
    installed: list[str] = []
    for d in dirs:
        try:
            installed += sorted(str(p) for p in d.glob("libggml-*.so*") if p.is_file())
        except OSError:
            continue
    return BackendLog(
        loaded=loaded,
        failed=failed,
        unsupported=unsupported,
        init_failures=backend_init_failures(lines),
        installed=tuple(dict.fromkeys(installed)),
    )


#: ``version: 8681 (build 0, commit 4df29be)``; a distribution's build names itself instead of a
#: commit (Debian's package: ``version: 0.7.0 (build 11669, commit Debian)``).
_VERSION_RE = re.compile(r"version:\s*(\S+)\s*\(build\s*(\d+),\s*commit\s*([^\s)]+)\)")
#: Before ``--list-devices`` (it acts while the arguments are parsed): the info lines of the
#: backend loading (``load_backend: loaded ROCm backend from …``) of a build whose backends are
#: loadable libraries. A self-contained build prints the same list without them.
_LIST_VERBOSITY = ("--log-verbosity", "4")
_ACCEL_OF = {"ROCm": "hip", "CUDA": "cuda", "Vulkan": "vulkan", "Metal": "metal", "SYCL": "sycl"}


@dataclass(frozen=True)
class BinaryInfo:
    path: Path
    version: str
    build: int
    commit: str
    accels: tuple[str, ...]  # what it can compute on: cpu and the GPU devices it lists
    devices: tuple[ListedDevice, ...] = ()
    source: str = "path"  # "setting", "cache", "path"
    build_accel: str | None = None  # what our cache recorded (build-info.json's "backend")
    extra: dict[str, object] = field(default_factory=dict, compare=False)
    selftest: SelfTest | None = field(default=None, compare=False)
    #: A build with its backends as loadable libraries (GGML_BACKEND_DL, distribution packages):
    #: what ``--list-devices`` logged about them.
    backend_log: BackendLog = field(default_factory=lambda: BackendLog(), compare=False)
    #: build-info.json's ``gpu_run`` of a forge build for a GPU: did it compute on its GPU here.
    gpu_run: GpuRun | None = field(default=None, compare=False)

    @property
    def unused_gpu_backends(self) -> tuple[str, ...]:
        """The GPU backends it has that see no device here, with why: ``ROCm: no ROCm-capable
        device is detected`` (a HIP build on a machine without an AMD GPU serves on the CPU)."""
        listed = {re.sub(r"\d+$", "", d.name) for d in self.devices}
        return tuple(f for f in self.backend_log.init_failures if f.split(":", 1)[0] not in listed)

    @property
    def child_args(self) -> tuple[str, ...]:
        """Flags every child of this binary needs on this CPU (the self-test's workaround)."""
        return self.selftest.child_args if self.selftest is not None else ()

    def to_json(self) -> dict[str, object]:
        return {
            "path": str(self.path),
            "version": self.version,
            "build": self.build,
            "commit": self.commit,
            "accels": list(self.accels),
            # The first name of "accels", kept for the scripts that read it.
            "backends": list(self.accels),
            "devices": [d.__dict__ for d in self.devices],
            "source": self.source,
            "child_args": list(self.child_args),
            "selftest": self.selftest.to_json() if self.selftest is not None else None,
            "backend_libraries": self.backend_log.to_json(),
            "unused_gpu_backends": list(self.unused_gpu_backends),
            "gpu_run": self.gpu_run.to_json() if self.gpu_run is not None else None,
        }

    def with_selftest(self, settings: ForgeSettings, build_info: Mapping[str, object] | None) -> BinaryInfo:
        """This binary, proven on this CPU (raises :class:`SelfTestFailed` when it is not)."""
        result = proven(self.path, settings, build_info=build_info)
        return BinaryInfo(**{**self.__dict__, "selftest": result})


def child_flags(binary: Path, settings: ForgeSettings) -> tuple[str, ...]:
    """The flags every child of ``binary`` needs on this CPU (``--no-repack`` where ggml's AMX
    kernels crash): its self-test's result from a forge build's ``build-info.json`` or an earlier
    run's record, else the self-test run now, once. () when self-tests are off (``FORGE_SELFTEST``).

    For a binary a caller names directly (a ``Supervisor`` given a path, a bench): the same flags
    :func:`locate_llama_server` gives the one it finds. Raises :class:`SelfTestFailed`.
    """
    result = selftest_of(binary, settings)
    return result.child_args if result is not None else ()


def selftest_of(binary: Path, settings: ForgeSettings) -> SelfTest | None:
    """:func:`child_flags`' whole self-test result (its slot restore check among it)."""
    return proven(binary, settings, build_info=build_info_of(binary))


def build_info_of(binary: Path) -> dict[str, object] | None:
    """The ``build-info.json`` of the cache entry a binary lies in (through symlinks), if any."""
    try:
        info_file = binary.resolve().parents[1] / "build-info.json"
        data = json.loads(info_file.read_text())
    except (OSError, ValueError, IndexError):
        return None
    return data if isinstance(data, dict) else None


def probe_binary(
    path: Path,
    env: Mapping[str, str] | None = None,
    *,
    list_devices: bool = True,
    source: str = "path",
) -> BinaryInfo:
    """Run ``--version`` (and ``--list-devices``) and parse them. Raises BinaryNotFound if unusable."""
    if not path.is_file() or not os.access(path, os.X_OK):
        raise BinaryNotFound(f"{path} is not an executable file", hint="run `forge build`, or fix the path")
    run_env = dict(os.environ if env is None else env)
    try:
        ver = subprocess.run(
            probe_argv(path, version=True), capture_output=True, text=True, timeout=30, env=run_env
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise BinaryNotFound(f"{path} could not be run: {exc}", hint="run `forge build`") from exc
    m = _VERSION_RE.search(ver.stderr + ver.stdout)
    if ver.returncode != 0 or m is None:
        raise BinaryNotFound(
            f"{path} did not answer --version like llama-server",
            hint="point FORGE_LLAMA_SERVER at a llama-server binary, or run `forge build`",
        )
    devices: list[ListedDevice] = []
    backend_log = BackendLog()
    if list_devices:
        try:
            argv = probe_argv(path)
            listing = subprocess.run(
                [argv[0], *_LIST_VERBOSITY, *argv[1:]],
                capture_output=True,
                text=True,
                timeout=60,
                env=run_env,
            )
            out, log = listing.stdout, listing.stderr
        except (OSError, subprocess.SubprocessError):
            out = log = ""
        devices = parse_device_list(out)
        backend_log = parse_backend_log(out + "\n" + log)
    accels = ["cpu"]
    for d in devices:
        a = _ACCEL_OF.get(re.sub(r"\d+$", "", d.name), d.name.lower())
        if a not in accels:
            accels.append(a)
    return BinaryInfo(
        path=path,
        version=m[1],
        build=int(m[2]),
        commit=m[3],
        accels=tuple(accels),
        devices=tuple(devices),
        source=source,
        backend_log=backend_log,
    )


def cached_builds(settings: ForgeSettings) -> list[tuple[Path, dict[str, object]]]:
    """Finished builds in the cache (a build is finished iff its ``build-info.json`` exists)."""
    found: list[tuple[Path, dict[str, object]]] = []
    root = settings.builds_dir
    if not root.is_dir():
        return found
    for info_file in sorted(root.glob("*/build-info.json")):
        try:
            meta = json.loads(info_file.read_text())
        except (OSError, ValueError):
            continue
        binary = info_file.parent / "bin" / "llama-server"
        if binary.is_file() and isinstance(meta, dict):
            found.append((binary, meta))
    return found


def locate_llama_server(
    settings: ForgeSettings,
    *,
    configured: Path | None = None,
    list_devices: bool = False,
    rpc: bool = False,
) -> BinaryInfo:
    """The llama-server every command uses. ``list_devices`` also asks it for its devices (slower).

    ``rpc``: one that accepts ``--rpc`` (a ``forge build --rpc`` build). Without it a plain build
    is preferred over an RPC one of the same accel; both behave the same without ``--rpc``.
    Every candidate answers ``--version`` and passes its self-test on this CPU, or is skipped.
    """

    def accept(path: Path, source: str, meta: Mapping[str, object] | None) -> BinaryInfo:
        info = probe_binary(path, list_devices=list_devices, source=source)
        if source == "setting":
            meta = build_info_of(path)  # a forge build named by its path still has its record
        info = info.with_selftest(settings, meta)
        if meta is None:
            return info
        recorded = {"build_accel": str(meta.get("backend")), "gpu_run": GpuRun.from_json(meta.get("gpu_run"))}
        return BinaryInfo(**{**info.__dict__, **recorded})

    return locate(
        LLAMA,
        settings,
        accept,
        configured=configured,
        want=(lambda meta: meta.get("rpc") is True) if rpc else (lambda meta: True),
        on_path=not rpc,  # unknown whether one on PATH has --rpc
        not_found=(
            "no llama-server built with the RPC backend found",
            "run `forge build --rpc` (same --accel as the workers'), "
            "or set FORGE_LLAMA_SERVER to a llama-server built with -DGGML_RPC=ON",
        )
        if rpc
        else (
            "no llama-server found",
            "run `forge build` (or `make setup`), or set FORGE_LLAMA_SERVER to a llama-server binary",
        ),
    )


def locate_rpc_server(settings: ForgeSettings, *, configured: Path | None = None) -> Path:
    """llama.cpp's RPC worker (``ggml-rpc-server``): ``configured``, else the cached RPC build of the
    pinned commit for this CPU (GPU accels first, as llama-server's), else ``ggml-rpc-server`` / ``rpc-server`` on PATH.

    It has no ``--version``; a candidate is checked by being an executable file only, and a wrong
    one fails at the worker's start with its own output in the error.
    """
    if configured is not None:
        path = configured.expanduser()
        if not path.is_file() or not os.access(path, os.X_OK):
            raise BinaryNotFound(
                f"{path} is not an executable file", hint="point --rpc-server at a ggml-rpc-server binary"
            )
        return path
    for llama, _meta in cached_for_this_cpu(settings, LLAMA, want=lambda meta: meta.get("rpc") is True):
        binary = llama.parent / RPC_SERVER_TARGET
        if binary.is_file() and os.access(binary, os.X_OK):
            return binary
    for name in (RPC_SERVER_TARGET, "rpc-server"):
        found = shutil.which(name)
        if found:
            return Path(found)
    raise BinaryNotFound(
        "no ggml-rpc-server found",
        hint="run `forge build --rpc` (it builds llama.cpp's RPC worker beside llama-server)",
    )
