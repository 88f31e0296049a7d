"""Stopping a whole process group that a synchronous caller started (``start_new_session=True``).

``forge build`` runs cmake in its own session; an interrupted build must take every compiler job
with it. The build self-tests start a server for one completion and stop it the same way. Those
signals are sent here so that ``process/`` stays the only sender of signals (a test greps for it).

A forge killed outright (SIGKILL, the OOM killer) runs no cleanup, and ``PR_SET_PDEATHSIG`` would
reach cmake only, not ninja or the compilers it forks. So a build's group is also watched by a
:class:`GroupReaper`: a tiny process in a session of its own, holding the read end of a pipe whose
write end only forge holds. When forge dies the kernel closes that end; the reaper reads EOF and
kills the group. A finished build writes one byte first, and the reaper leaves quietly.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys

__all__ = ["GroupReaper", "kill_process_group", "stop_process_group"]

_REAPER = (
    "import os,signal,sys\n"
    "for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP): signal.signal(s, signal.SIG_IGN)\n"
    "if not os.read(0, 1):\n"
    "    try: os.killpg(int(sys.argv[1]), signal.SIGKILL)\n"
    "    except OSError: pass\n"
)


def kill_process_group(proc: subprocess.Popen[str] | subprocess.Popen[bytes]) -> None:
    """SIGKILL ``proc``'s group (it must lead one: ``start_new_session=True``) and reap it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def stop_process_group(proc: subprocess.Popen[str] | subprocess.Popen[bytes], timeout: float = 10) -> None:
    """SIGTERM to ``proc``'s group, ``timeout`` seconds for it to exit, then SIGKILL; reaped. Once
    the leader is gone, whatever it forked into its group is killed too: nothing stays."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_process_group(proc)
    else:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # anything it forked into its group


class GroupReaper:
    """Kills process group ``pgid`` if this process dies before :meth:`release`."""

    def __init__(self, pgid: int) -> None:
        read_end, self._write_end = os.pipe()  # both non-inheritable: no other child holds them
        try:
            self._proc: subprocess.Popen[bytes] | None = subprocess.Popen(
                [sys.executable, "-c", _REAPER, str(pgid)],
                stdin=read_end,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,  # a Ctrl-C to the terminal's group does not reach it
            )
        except OSError:
            self._proc = None  # no watcher: the in-process cleanup still covers Ctrl-C and SIGTERM
        finally:
            os.close(read_end)

    def release(self) -> None:
        """The group ended (or was killed) by us: the reaper exits without a signal."""
        with contextlib.suppress(OSError):
            os.write(self._write_end, b"x")
        with contextlib.suppress(OSError):
            os.close(self._write_end)
        if self._proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=10)
