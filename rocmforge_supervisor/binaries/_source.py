"""Where the sources come from: an explicit tree, the submodule, or a pinned PyPI sdist.

These machines cannot clone llama.cpp or whisper.cpp, but PyPI sdists vendor exactly the pinned
commits (``llama-cpp-python==0.3.35`` under ``vendor/llama.cpp/``, ``pywhispercpp==1.5.1`` under
``whisper.cpp/``): each is a :class:`PinnedSdist`, fetched by the one :func:`fetch_pinned`. It is
downloaded with pip (so pip's own index and proxy configuration apply), its sha256 is checked
against the pinned one, and it is unpacked into the cache under a temporary name that is renamed
into place only when complete: a failed download, a wrong hash or a full disk leaves the cache as
it was.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock

from .._errors import SourceError, ToolchainMissing
from .._files import sha256_file
from .._version import (
    LLAMA_CPP_COMMIT,
    LLAMA_CPP_SDIST,
    LLAMA_CPP_SDIST_SHA256,
    WHISPER_CPP_COMMIT,
    WHISPER_CPP_SDIST,
    WHISPER_CPP_SDIST_SHA256,
)
from ..config import ForgeSettings

__all__ = [
    "LLAMA_SDIST",
    "WHISPER_SDIST",
    "PinnedSdist",
    "SourceTree",
    "fetch_pinned",
    "repo_root",
    "resolve_source",
]


@dataclass(frozen=True)
class PinnedSdist:
    """A PyPI sdist that vendors one pinned source tree, and how to tell the tree is complete."""

    name: str  # the tree's name in the cache: ``<name>-<commit[:12]>`` under ``src/``
    commit: str
    spec: str  # what pip downloads, ``project==version``
    sha256: str
    #: ``:all:``, or the project's own name where ``:all:`` would make pip compile the build
    #: dependencies (cmake) from source just to read the sdist's metadata (pywhispercpp: minutes).
    no_binary: str
    pattern: str  # the archive pip leaves, as a glob
    inner: tuple[str, ...]  # where the tree lies inside the archive
    marker: tuple[str, ...]  # a file only a complete tree has
    lock: str  # the lock file's name under ``src/`` (kept per tree: the names existing caches use)
    fallback: str = ""  # a way around the download, for the hash error's hint


LLAMA_SDIST = PinnedSdist(
    name="llama.cpp",
    commit=LLAMA_CPP_COMMIT,
    spec=LLAMA_CPP_SDIST,
    sha256=LLAMA_CPP_SDIST_SHA256,
    no_binary=":all:",
    pattern="llama_cpp_python-*.tar.gz",
    inner=("vendor", "llama.cpp"),
    marker=("CMakeLists.txt",),
    lock=".sdist.lock",
    fallback=", or pass a verified tree with --source",
)
WHISPER_SDIST = PinnedSdist(
    name="whisper.cpp",
    commit=WHISPER_CPP_COMMIT,
    spec=WHISPER_CPP_SDIST,
    sha256=WHISPER_CPP_SDIST_SHA256,
    no_binary="pywhispercpp",
    pattern="pywhispercpp-*.tar.gz",
    inner=("whisper.cpp",),
    marker=("examples", "server", "server.cpp"),
    lock=".whisper-sdist.lock",
)


@dataclass(frozen=True)
class SourceTree:
    path: Path
    commit: str
    origin: str  # "explicit", "submodule" or "sdist"


def repo_root() -> Path | None:
    """The checkout this package runs from (editable install), if it is one."""
    root = Path(__file__).resolve().parents[2]
    return root if (root / ".gitmodules").is_file() else None


def _check_tree(path: Path, origin: str) -> Path:
    if not path.is_dir():
        raise SourceError(
            f"llama.cpp source directory {path} does not exist",
            hint="pass an existing llama.cpp checkout with --source, or leave it unset to use the pinned one",
        )
    if not (path / "CMakeLists.txt").is_file() or not (path / "tools" / "server").is_dir():
        raise SourceError(
            f"{path} is not a llama.cpp source tree (no CMakeLists.txt with tools/server)",
            hint="point --source / FORGE_LLAMA_CPP_SOURCE at the root of a llama.cpp checkout",
        )
    return path


def _tree_commit(path: Path) -> str:
    """The commit of a git checkout, or 'unknown' (a plain source tree has no git metadata)."""
    try:
        out = subprocess.run(
            ["git", "-C", str(path), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out or "unknown"


def resolve_source(settings: ForgeSettings, explicit: Path | None = None) -> SourceTree:
    """Find the llama.cpp sources, in the documented order."""
    chosen = explicit or settings.llama_cpp_source
    if chosen is not None:
        path = _check_tree(chosen.expanduser().resolve(), "explicit")
        return SourceTree(path, _tree_commit(path), "explicit")
    root = repo_root()
    if root is not None and (root / "llama.cpp" / "CMakeLists.txt").is_file():
        return SourceTree(root / "llama.cpp", LLAMA_CPP_COMMIT, "submodule")
    return SourceTree(_sdist_tree(settings), LLAMA_CPP_COMMIT, "sdist")


def _sdist_tree(settings: ForgeSettings) -> Path:
    return fetch_pinned(settings, LLAMA_SDIST)


def fetch_pinned(settings: ForgeSettings, sdist: PinnedSdist) -> Path:
    """The pinned tree of ``sdist``, unpacked from the verified archive into the cache (once)."""
    src_root = settings.cache_dir / "src"
    final = src_root / f"{sdist.name}-{sdist.commit[:12]}"
    if final.joinpath(*sdist.marker).is_file():
        return final
    src_root.mkdir(parents=True, exist_ok=True)
    with FileLock(str(src_root / sdist.lock)):
        if final.joinpath(*sdist.marker).is_file():  # another process finished it while we waited
            return final
        with tempfile.TemporaryDirectory(prefix=".fetch-", dir=src_root) as tmp:
            archive = _download_sdist(Path(tmp), sdist)
            got = sha256_file(archive)
            if got != sdist.sha256:
                raise SourceError(
                    f"{archive.name} has sha256 {got}, expected {sdist.sha256}",
                    hint="the download was altered or the index serves another file; "
                    "check your pip index configuration" + sdist.fallback,
                )
            staging = Path(tmp) / "tree"
            _unpack_vendor(archive, staging, sdist.inner)
            staging.rename(final)
    return final


def _download_sdist(dest: Path, sdist: PinnedSdist) -> Path:
    """``pip download`` of the pinned sdist (its sha256 is checked by the caller)."""
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-binary", sdist.no_binary, "--no-deps",
        "--disable-pip-version-check", "-d", str(dest), sdist.spec,
    ]  # fmt: skip
    spec = sdist.spec
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    except FileNotFoundError as exc:
        raise ToolchainMissing("pip is not available", hint="install pip for this Python") from exc
    except subprocess.TimeoutExpired as exc:
        raise SourceError(
            f"downloading {spec} timed out",
            hint="check the network, or pass a llama.cpp tree with --source",
        ) from exc
    archives = sorted(dest.glob(sdist.pattern))
    if proc.returncode != 0 or not archives:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-6:]
        raise SourceError(
            f"could not download {spec} with pip",
            hint="check network access to PyPI (or pip's index settings), "
            "or populate the llama.cpp submodule / pass --source",
            log_tail=tail,
        )
    return archives[0]


def _unpack_vendor(archive: Path, staging: Path, inner: tuple[str, ...]) -> None:
    """Extract only ``*/<inner>/`` (``vendor/llama.cpp``) from the sdist into ``staging``."""
    try:
        with tarfile.open(archive, "r:gz") as tar:
            members = []
            for m in tar.getmembers():
                parts = Path(m.name).parts
                depth = 1 + len(inner)
                if len(parts) > depth and parts[1:depth] == inner:
                    m.name = str(Path(*parts[depth:]))
                    members.append(m)
            if not members:
                raise SourceError(
                    f"{archive.name} has no {'/'.join(inner)} tree",
                    hint="this is not the expected sdist; pass a llama.cpp tree with --source",
                )
            staging.mkdir(parents=True)
            tar.extractall(staging, members=members, filter="data")
    except OSError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        raise SourceError(
            f"could not unpack {archive.name}: {exc.strerror or exc}",
            hint="free disk space in the cache directory (FORGE_CACHE_DIR) and retry",
        ) from exc
    except tarfile.TarError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        raise SourceError(f"{archive.name} is not a valid archive: {exc}", hint="retry the download") from exc
