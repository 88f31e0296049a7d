"""whisper-server's command line (whisper.cpp ``examples/server``), as forge builds it.

The second backend's flag vocabulary, kept beside llama-server's (:mod:`._argv`) and apart from it:
the two servers share a few spellings (``-m``, ``--host``, ``--port``, ``-t``) and nothing else.
whisper-server loads the model before it binds its port, so ``GET /health`` answering 200 is the
readiness signal; it has no API key, no ``/metrics``, no slots. ``--convert`` (any audio format, by
running ``ffmpeg``) is only passed when ffmpeg is installed: without it whisper-server refuses to
start; without ``--convert`` it reads WAV only.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

__all__ = ["WHISPER_OWNED_FLAGS", "whisper_argv", "whisper_owned_flag"]

#: Flags forge sets itself on a whisper child (or that would move the routes the gateway calls).
WHISPER_OWNED_FLAGS = frozenset(
    {
        "-m", "--model", "--host", "--port", "--public", "-pp", "--public-path",
        "--request-path", "--inference-path", "--convert", "-ng", "--no-gpu",
    }
)  # fmt: skip


def whisper_owned_flag(arg: str) -> bool:
    return arg.partition("=")[0] in WHISPER_OWNED_FLAGS


def whisper_argv(
    *,
    binary: Path,
    model_path: Path,
    host: str,
    port: int,
    cpu_only: bool,
    extra_args: Sequence[str],
    which: Callable[[str], str | None] = shutil.which,
    threads: int | None = None,
) -> list[str]:
    """The whole command line of one whisper child; ``extra_args`` come last, so they win."""
    import psutil  # on use only: the config imports this module (start-up time)

    a = [
        str(binary),
        "-m", str(model_path),
        "--host", host,
        "--port", str(port),
        # llama.cpp's own default: one thread per physical core (whisper's, min(4, cores), leaves
        # most of a big CPU idle for the one request it serves at a time).
        "-t", str(threads or psutil.cpu_count(logical=False) or os.cpu_count() or 1),
    ]  # fmt: skip
    if cpu_only:
        a.append("-ng")  # no GPU: whisper.cpp would otherwise pick the first one it sees
    if which("ffmpeg") is not None:
        a.append("--convert")  # mp3, m4a, ogg, … through ffmpeg; without it, WAV only
    a += list(extra_args)
    return a
