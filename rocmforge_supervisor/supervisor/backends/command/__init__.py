"""The command backend: an OpenAI-compatible server forge runs as configured (``cmd``), placed by the
``memory`` it is given, serving its ``routes``."""

from ....config import CommandKeys
from .._entry import Backend
from ._plan import command_request, plan_command
from ._program import CommandProgram
from ._server import CommandServerKind, command_argv

__all__ = ["BACKEND", "CommandProgram", "CommandServerKind", "command_argv", "command_request"]

BACKEND = Backend(
    "command",
    "a command (a server forge runs as configured)",
    "command · OpenAI-compatible server",
    plan_command,
    False,
    lambda c: frozenset(c.command_routes),
    reads_path=False,
    judges_media=True,
    keys=CommandKeys,
)
