"""Shared CLI bits: the consoles, and turning a ForgeError into one line and an exit code.

Both consoles read rich markup in what they print, for the CLI's own styling; anything that came
from a user, a file or llama-server goes through :func:`rich.markup.escape` (or ``markup=False``)
first, so that a ``[bracketed]`` path or name is printed as given and never read as a tag.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, NoReturn

from rich.console import Console
from rich.markup import escape

from .._errors import ForgeError

if TYPE_CHECKING:
    from ..config import ForgeSettings

__all__ = ["console", "err_console", "fail", "get_settings"]

console = Console(highlight=False, soft_wrap=True)
err_console = Console(stderr=True, highlight=False, soft_wrap=True)


def get_settings() -> ForgeSettings:
    """The process settings. Imported here, on first use, for start-up time: pydantic-settings is
    ~0.1 s that ``forge --help`` need not pay. (For the same reason every command imports its heavy
    parts inside the command function.)"""
    from ..config import get_settings as settings

    return settings()


def fail(exc: ForgeError) -> NoReturn:
    """Print ``error: <problem> — <fix>`` on stderr (no traceback) and exit with the error's code."""
    err_console.print(f"[bold red]error:[/] {escape(str(exc))}", markup=True, highlight=False)
    log_path = getattr(exc, "log_path", None)
    tail = getattr(exc, "log_tail", None) or getattr(exc, "stderr_tail", None)
    if tail:
        for line in tail[-12:]:
            err_console.print(f"  [dim]{escape(str(line))}[/]", markup=True, highlight=False)
    if log_path:
        err_console.print(f"  log: {log_path}", markup=False)
    sys.exit(exc.exit_code)
