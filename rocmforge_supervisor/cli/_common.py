"""Shared CLI bits: the consoles, and turning a ForgeError into one line and an exit code.

Both consoles read rich markup in what they print, for the CLI's own styling; anything that came
from a user, a file or llama-server goes through :func:`rich.markup.escape` (or ``markup=False``)
first, so that a ``[bracketed]`` path or name is printed as given and never read as a tag.
"""

from __future__ import annotations

import sys
from typing import NoReturn

from rich.console import Console
from rich.markup import escape

from .._errors import ForgeError

__all__ = ["console", "err_console", "fail"]

console = Console(highlight=False, soft_wrap=True)
err_console = Console(stderr=True, highlight=False, soft_wrap=True)


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
