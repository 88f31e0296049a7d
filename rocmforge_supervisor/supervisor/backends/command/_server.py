"""Any OpenAI-compatible server, run as a command the user names (``backend = "command"``), as a
:class:`~._child.ChildKind`: the fourth description on the one lifecycle, beside llama-server,
whisper-server and rpc-server.

forge knows nothing of the program but what the config says: its argv, with ``${PORT}``,
``${HOST}``, ``${MODEL}`` and ``${NAME}`` filled in at each start; when it is ready (``health``: a
path that answers 200, or ``ready_log``: a line it prints); extra environment. Everything else is
the lifecycle every child gets: its own process group and the parent-death signal, its log drained
from the first byte, readiness with the load's stall and deadline, SIGTERM then SIGKILL, restarts
with backoff and the breaker (the supervisor's).

It gets no API key (an unknown program has no ``--api-key-file``): like whisper-server, the child
listens on loopback only and the gateway's keys guard it.
"""

from __future__ import annotations

import signal
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

from ...._errors import StartFailed
from ....process import ChildProcess, ModelServerKind

__all__ = ["CommandServerKind", "command_argv"]

#: The placeholders a command's argv may use.
PLACEHOLDERS = ("PORT", "HOST", "MODEL", "NAME")

_HINTS = {
    "not_ready": "check the command's `health` path (or its `ready_log` pattern) and that it "
    "serves on ${PORT}; its log is above",
    "crashed": "the command exited before it was ready: see its log",
    "timeout": "it gave no sign of life within the load stall timeout: check `health` / `ready_log`, "
    "or raise supervisor.load_stall_timeout",
    "bind": "the port was taken: leave ${PORT} to forge",
    "illegal_instruction": "the CPU lacks an instruction the command's program was compiled for",
}


def command_argv(cmd: Sequence[str], *, port: int, host: str, model: str, name: str) -> list[str]:
    """``cmd`` with the placeholders filled in (``$$`` is a literal ``$``). An unknown placeholder
    was refused when the config was read (``config``'s command checks)."""
    values = {"PORT": str(port), "HOST": host, "MODEL": model, "NAME": name}
    return [string.Template(a).substitute(values) for a in cmd]


@dataclass(frozen=True)
class CommandServerKind(ModelServerKind):
    """A user's server: ready by its configured sign (the readiness is given to the
    :class:`ChildProcess`, not fixed per kind); its failures say which setting to check."""

    program: ClassVar[str] = "command"
    #: An unknown program may log on either stream: both are read, line-buffered.
    log_on_stdout: ClassVar[bool] = True
    spawn_hint: ClassVar[str] = "check the model's `cmd`: its first word must be an executable"
    hints: ClassVar[Mapping[str, str]] = _HINTS
    default_hint: ClassVar[str | None] = "see the command's log"

    #: What readiness waits for, for the messages: ``GET /health`` or ``the log line 'regex'``.
    ready_sign: str = "GET /health"

    def classify(self, tail: list[str], returncode: int | None) -> str:
        if returncode == -signal.SIGILL:
            return "illegal_instruction"
        return "crashed"

    def failure(self, reason: str, message: str, child: ChildProcess) -> StartFailed:
        if reason == "timeout":
            message = f"{message} (waiting for {self.ready_sign})"
        return super().failure(reason, message, child)
