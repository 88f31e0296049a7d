"""One ``forge serve`` per state directory: an exclusive lock on ``<state_dir>/serve.lock``.

The state directory holds what a running service owns alone: ``children.json`` (the ledger that
the next run's orphan sweep trusts) and ``service.json`` (how ``forge ps`` finds it). A second
service on the same directory started silently, and when it exited it wrote an empty ledger and
removed nothing of its own — ``forge ps`` said no service was running while the first one served,
and the first one's children were no longer on record. So the second one refuses to
start, naming the first one's pid.

``flock``, not a pid file: the kernel drops the lock when the holder dies, however it dies, so a
stale file never blocks a start. The file stays (removing a lock file races a starter that has
just opened it); the pid in it is only there to be named. The descriptor is not inheritable, so a
llama-server child never holds the lock after its parent is gone.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from .._errors import ServiceError

__all__ = ["StateDirLock"]


class StateDirLock:
    """Held from :meth:`acquire` to :meth:`release` (the whole life of ``forge serve``)."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self._fd: int | None = None

    @property
    def path(self) -> Path:
        return self.state_dir / "serve.lock"

    def acquire(self) -> None:
        """Take the lock, or raise :class:`ServiceError` naming the pid that holds it."""
        try:
            self.state_dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise ServiceError(
                f"cannot lock the state directory {self.state_dir}: {exc.strerror or exc}",
                hint="make it writable, or choose another (FORGE_STATE_DIR or server.state_dir)",
            ) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = _read_pid(fd)
            os.close(fd)
            who = f"pid {holder}" if holder else "another process"
            raise ServiceError(
                f"another forge serve ({who}) is already running on the state directory {self.state_dir}",
                hint="stop it first (`forge ps` talks to it), or give this one its own state directory "
                "(FORGE_STATE_DIR or server.state_dir)",
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        """Idempotent. The file stays; the next holder rewrites the pid."""
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
            os.close(fd)  # closing the descriptor drops the flock


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        return int(text) if text.isdigit() else None
    except OSError:
        return None
