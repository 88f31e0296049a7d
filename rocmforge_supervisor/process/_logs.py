"""A child's log: drained at once, kept in a bounded ring, written to a file, and read for signs.

llama-server writes everything to stderr. If nobody reads the pipe, a chatty child blocks on a
full pipe buffer; so a task drains it from the moment the child starts, for its whole life.
"""

from __future__ import annotations

import collections
import contextlib
import re
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import IO

import anyio
import anyio.abc

__all__ = ["OOM_PATTERNS", "RPC_FAILED_RE", "LogRing", "classify_failure", "crash_cause", "lines_of"]

#: What GPU backends print when an allocation fails (the strings peers match too).
OOM_PATTERNS = re.compile(
    r"out of memory|hipMalloc failed|cudaMalloc failed|failed to allocate|ErrorOutOfDeviceMemory",
    re.IGNORECASE,
)
LISTENING_RE = re.compile(r"listening on (https?://\S+)")
BIND_FAILED_RE = re.compile(r"couldn't bind HTTP server socket")
#: What llama-server aborts with when an RPC worker it placed layers on dies or drops the link
#: (ggml-rpc.cpp's RPC_STATUS_ASSERT), or when one is unreachable at load.
RPC_FAILED_RE = re.compile(
    r"Remote RPC server crashed|Failed to connect to .*:\d+|failed to register RPC device"
)

LineListener = Callable[[str], object]


async def lines_of(
    stream: anyio.abc.ByteReceiveStream, on_chunk: Callable[[], object] | None = None
) -> AsyncIterator[str]:
    """A child's pipe as decoded lines until it closes, the last unterminated one included.
    ``on_chunk`` runs for every read, newline or not (llama-server's load progress dots have none)."""
    pending = b""
    with contextlib.suppress(anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
        async for chunk in stream:
            if on_chunk is not None:
                on_chunk()
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for raw in lines:
                yield raw.decode("utf-8", "replace").rstrip("\r")
    if pending:
        yield pending.decode("utf-8", "replace")


class LogRing:
    """The last ``maxlen`` lines in memory, every line appended to ``path``."""

    def __init__(self, path: Path | None, maxlen: int = 400) -> None:
        self.lines: collections.deque[str] = collections.deque(maxlen=maxlen)
        self.path = path
        self._file: IO[str] | None = None
        self._listeners: list[LineListener] = []
        self.total_lines = 0
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = path.open("a", encoding="utf-8", errors="replace", buffering=1)

    def subscribe(self, listener: LineListener) -> Callable[[], None]:
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener) if listener in self._listeners else None

    def add(self, line: str) -> None:
        self.lines.append(line)
        self.total_lines += 1
        if self._file is not None:
            with contextlib.suppress(OSError, ValueError):  # disk full / closed: the ring still has it
                self._file.write(line + "\n")
        for listener in list(self._listeners):
            listener(line)

    def note(self, text: str) -> None:
        """A line of our own (start, stop, exit status) in the same log."""
        self.add(f"[forge] {text}")

    def tail(self, n: int = 20) -> list[str]:
        return list(self.lines)[-n:]

    def close(self) -> None:
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()
            self._file = None


_CLASSIFY: list[tuple[str, re.Pattern[str]]] = [
    # First: an abort prints a gdb backtrace whose "…/wait4.c: No such file or directory" lines
    # would otherwise read as a missing model file.
    ("rpc_worker", RPC_FAILED_RE),
    ("bind", BIND_FAILED_RE),
    ("file_not_found", re.compile(r"failed to open GGUF file .*No such file|No such file or directory")),
    ("unsupported", re.compile(r"unknown model architecture|unsupported model architecture")),
    (
        "invalid_model",
        re.compile(r"invalid magic|gguf_init_from|failed to load model|not a GGUF|unsupported.*version"),
    ),
    ("oom", OOM_PATTERNS),
    ("bad_args", re.compile(r"error: invalid argument|error while handling argument|invalid device")),
]


def classify_failure(lines: list[str]) -> str:
    """Why a child ended, from its last log lines: the first matching class wins."""
    text = "\n".join(lines)
    for name, pattern in _CLASSIFY:
        if pattern.search(text):
            return name
    return "crashed"


def crash_cause(lines: list[str]) -> str | None:
    """A running child's death that its log explains (an RPC worker gone), as a phrase; else None."""
    if any(RPC_FAILED_RE.search(line) for line in lines):
        return "an RPC worker it placed layers on failed (Remote RPC server crashed or unreachable)"
    return None
