"""Finding a llama-server to run, and asking it what it is.

Locate order, for every command that needs the binary: ``FORGE_LLAMA_SERVER`` (or a config path)
→ the cached build for the pinned commit (preferring GPU backends) → ``llama-server`` on PATH.
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
from .._errors import BinaryNotFound, SelfTestFailed
from .._version import LLAMA_CPP_COMMIT
from ..config import ForgeSettings
from ..hardware import ListedDevice, cpu_flags, parse_device_list
from ._plan import RPC_SERVER_TARGET, isa_fingerprint
from ._selftest import SelfTest, proven

__all__ = [
    "BinaryInfo",
    "ListedDevice",
    "build_info_of",
    "cached_builds",
    "child_flags",
    "locate_llama_server",
    "locate_rpc_server",
    "parse_device_list",
    "probe_binary",
]

_VERSION_RE = re.compile(r"version:\s*(\S+)\s*\(build\s*(\d+),\s*commit\s*([0-9a-fA-F]+|unknown)\)")
_BACKEND_OF = {"ROCm": "hip", "CUDA": "cuda", "Vulkan": "vulkan", "Metal": "metal", "SYCL": "sycl"}


@dataclass(frozen=True)
class BinaryInfo:
    path: Path
    version: str
    build: int
    commit: str
    backends: tuple[str, ...]
    devices: tuple[ListedDevice, ...] = ()
    source: str = "path"  # "setting", "cache", "path"
    build_backend: str | None = None  # what our cache recorded, when it came from there
    extra: dict[str, object] = field(default_factory=dict, compare=False)
    selftest: SelfTest | None = field(default=None, compare=False)

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
            "backends": list(self.backends),
            "devices": [d.__dict__ for d in self.devices],
            "source": self.source,
            "child_args": list(self.child_args),
            "selftest": self.selftest.to_json() if self.selftest is not None else None,
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
    result = proven(binary, settings, build_info=build_info_of(binary))
    return result.child_args if result is not None else ()


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
    if list_devices:
        try:
            out = subprocess.run(
                probe_argv(path), capture_output=True, text=True, timeout=60, env=run_env
            ).stdout
        except (OSError, subprocess.SubprocessError):
            out = ""
        devices = parse_device_list(out)
    backends = ["cpu"]
    for d in devices:
        b = _BACKEND_OF.get(re.sub(r"\d+$", "", d.name), d.name.lower())
        if b not in backends:
            backends.append(b)
    return BinaryInfo(
        path=path,
        version=m[1],
        build=int(m[2]),
        commit=m[3],
        backends=tuple(backends),
        devices=tuple(devices),
        source=source,
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


_BACKEND_PREFERENCE = {"hip": 0, "cuda": 1, "vulkan": 2, "cpu": 3}


def locate_llama_server(
    settings: ForgeSettings,
    *,
    configured: Path | None = None,
    list_devices: bool = False,
    rpc: bool = False,
) -> BinaryInfo:
    """The llama-server every command uses. ``list_devices`` also asks it for its devices (slower).

    ``rpc``: one that accepts ``--rpc`` (a ``forge build --rpc`` build). Without it a plain build
    is preferred over an RPC one of the same backend; both behave the same without ``--rpc``.
    """
    tried: list[str] = []
    failed_selftest: SelfTestFailed | None = None
    explicit = configured or settings.llama_server
    if explicit is not None:
        # An explicit choice is never silently replaced by another binary.
        path = explicit.expanduser()
        info = probe_binary(path, list_devices=list_devices, source="setting")
        return info.with_selftest(settings, build_info_of(path))
    here = isa_fingerprint(cpu_flags())
    builds = []
    for b, meta in cached_builds(settings):
        if str(meta.get("commit", ""))[:7] != LLAMA_CPP_COMMIT[:7] or (rpc and meta.get("rpc") is not True):
            continue
        if meta.get("cpu") not in (None, "portable", here):  # a shared cache: built for another CPU
            tried.append(f"{b}: built for another CPU ({meta.get('cpu')}, this one is {here})")
            continue
        builds.append((b, meta))
    # GPU backends first; of the same backend a native build before a portable one (it is tuned
    # to this CPU), and a plain one before an RPC one (they behave the same without --rpc).
    builds.sort(
        key=lambda bm: (
            _BACKEND_PREFERENCE.get(str(bm[1].get("backend")), 9),
            bm[1].get("portable") is True,
            bm[1].get("rpc") is True,
        )
    )
    for binary, meta in builds:
        try:
            info = probe_binary(binary, list_devices=list_devices, source="cache")
            info = info.with_selftest(settings, meta)
        except SelfTestFailed as exc:
            failed_selftest = failed_selftest or exc
            tried.append(f"{binary}: {exc.message}")
            continue
        except BinaryNotFound as exc:
            tried.append(f"{binary}: {exc.message}")
            continue
        return BinaryInfo(**{**info.__dict__, "build_backend": str(meta.get("backend"))})
    on_path = None if rpc else shutil.which("llama-server")  # unknown whether it has --rpc
    if on_path:
        try:
            info = probe_binary(Path(on_path), list_devices=list_devices, source="path")
            return info.with_selftest(settings, None)
        except SelfTestFailed as exc:
            failed_selftest = failed_selftest or exc
            tried.append(f"{on_path}: {exc.message}")
        except BinaryNotFound as exc:
            tried.append(f"{on_path}: {exc.message}")
    if failed_selftest is not None:
        raise SelfTestFailed(
            f"no llama-server here passed its self-test: {'; '.join(tried)}", hint=failed_selftest.hint
        )
    detail = f" (skipped: {'; '.join(tried)})" if tried else ""
    if rpc:
        raise BinaryNotFound(
            f"no llama-server built with the RPC backend found{detail}",
            hint="run `forge build --rpc` (same backend as the workers'), "
            "or set FORGE_LLAMA_SERVER to a llama-server built with -DGGML_RPC=ON",
        )
    raise BinaryNotFound(
        f"no llama-server found{detail}",
        hint="run `forge build` (or `make setup`), or set FORGE_LLAMA_SERVER to a llama-server binary",
    )


def locate_rpc_server(settings: ForgeSettings, *, configured: Path | None = None) -> Path:
    """llama.cpp's RPC worker (``ggml-rpc-server``): ``configured``, else the cached RPC build of the
    pinned commit (GPU backends first), else ``ggml-rpc-server`` / ``rpc-server`` on PATH.

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
    builds = [
        (b.parent / RPC_SERVER_TARGET, meta)
        for b, meta in cached_builds(settings)
        if str(meta.get("commit", ""))[:7] == LLAMA_CPP_COMMIT[:7] and meta.get("rpc") is True
    ]
    builds.sort(key=lambda bm: _BACKEND_PREFERENCE.get(str(bm[1].get("backend")), 9))
    for binary, _meta in builds:
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
