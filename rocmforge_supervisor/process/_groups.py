"""Killing a whole process group: the one signal-sending helper outside :class:`LlamaServer`.

``forge build`` runs cmake in its own session; an interrupted build must take every compiler job
with it, and that signal is sent here so that ``process/`` stays the only sender of signals.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess

__all__ = ["kill_process_group"]


def kill_process_group(proc: subprocess.Popen[str]) -> None:
    """SIGKILL ``proc``'s group (it must lead one: ``start_new_session=True``) and reap it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
