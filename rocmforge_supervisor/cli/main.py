"""Entry point of ``forge``: one typer app; expected errors become one line and an exit code."""

from __future__ import annotations

import typer

from .._errors import ForgeError
from .._version import LLAMA_CPP_COMMIT, __version__
from ._common import console, fail

__all__ = ["app", "main"]

app = typer.Typer(
    name="forge",
    help="Run llama.cpp's llama-server per GGUF model on AMD, NVIDIA or CPU.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=True,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version_callback(value: bool) -> None:
    if value:
        console.print(f"forge {__version__} (llama.cpp {LLAMA_CPP_COMMIT[:7]})")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version_callback, is_eager=True, help="Print versions and exit."
    ),
) -> None:
    """rocmforge-supervisor."""


def _register() -> None:
    from . import _activity, _build, _hardware, _load, _models, _plan, _serve, _service, _worker

    for module in (_build, _hardware, _models, _plan, _load, _serve, _activity, _service, _worker):
        module.register(app)


_register()


def main() -> None:
    try:
        app()
    except ForgeError as exc:
        fail(exc)
    except KeyboardInterrupt:
        raise SystemExit(130) from None
