"""A child's log: drained at once, kept in a bounded ring, written to a file, and read for signs.

llama-server writes everything to stderr. If nobody reads the pipe, a chatty child blocks on a
full pipe buffer; so a task drains it from the moment the child starts, for its whole life.

**One writer process per log file.** ``forge logs NAME`` reads ``logs/NAME.log``; a second
process appending to it (a private ``forge load`` of the same name, a second ``forge worker``)
would put its child's lines in that tail. So a :class:`LogRing` *claims* its file with an
exclusive ``flock`` for as long as it is open (the kernel drops it when the process dies, so a
crash leaves no stale claim); a file another process holds is left alone and the ring writes
``STEM.PID.log`` beside it. Rings of one process share a claim (a model's next child, while the
previous one stops, writes the same service log).

**Idle noise.** At ``-lv 4`` (the verbosity the allocation lines need) llama-server prints
``update_slots: all slots are idle`` every time its task loop wakes with nothing to do, which is
on every probe: a quiet model's log is mostly that line. :func:`without_idle` collapses such runs
in what ``forge logs`` shows; the file keeps every line.
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import os
import re
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import IO

import anyio
import anyio.abc

__all__ = [
    "IDLE_LINE_RE",
    "OOM_PATTERNS",
    "RPC_FAILED_RE",
    "LogRing",
    "classify_failure",
    "crash_cause",
    "line_blocks_of",
    "without_idle",
]

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

#: llama-server's lines that say nothing happened (its task loop woke and every slot was idle).
IDLE_LINE_RE = re.compile(r"update_slots: all slots are idle\s*$")

LineListener = Callable[[str], object]

#: This process's claims: log path → [the fd holding the flock, the rings using it].
_CLAIMS: dict[Path, list[int]] = {}


def _try_claim(path: Path) -> bool:
    held = _CLAIMS.get(path)
    if held is not None:
        held[1] += 1
        return True
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:  # another process holds it
        os.close(fd)
        return False
    except OSError:
        pass  # a file system without flock: write it unclaimed rather than not at all
    _CLAIMS[path] = [fd, 1]
    return True


def claim_log(path: Path) -> Path:
    """``path`` when no other live process writes it, else ``STEM.PID.log`` beside it (ours
    alone: a pid is unique among live processes); claimed until :func:`release_log`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if _try_claim(path):
        return path
    own = path.with_name(f"{path.stem}.{os.getpid()}{path.suffix}")
    _try_claim(own)
    return own


def release_log(path: Path) -> None:
    held = _CLAIMS.get(path)
    if held is None:
        return
    held[1] -= 1
    if held[1] <= 0:
        del _CLAIMS[path]
        os.close(held[0])  # closing the fd drops the flock


async def line_blocks_of(
    stream: anyio.abc.ByteReceiveStream, on_chunk: Callable[[], object] | None = None
) -> AsyncIterator[list[str]]:
    """A child's pipe as decoded lines until it closes, a read at a time: the complete lines of each
    read as one list, the last unterminated line at the end. ``on_chunk`` runs for every read,
    newline or not (llama-server's load progress dots have none).

    Why blocks: at ``-lv 4`` a llama-server with 32 slots prints ~110 lines per request
    (its prompt-cache trace), thousands in a burst when a batch of requests lands; taken a line at
    a time (a write, listeners, patterns each) they held the gateway's event loop for tens of ms
    while those requests waited to be read."""
    pending = b""
    with contextlib.suppress(anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
        async for chunk in stream:
            if on_chunk is not None:
                on_chunk()
            pending += chunk
            if b"\n" not in chunk:
                continue
            *lines, pending = pending.split(b"\n")
            yield [raw.decode("utf-8", "replace").rstrip("\r") for raw in lines]
    if pending:
        yield [pending.decode("utf-8", "replace")]


class LogRing:
    """The last ``maxlen`` lines in memory, every line appended to ``path``."""

    def __init__(self, path: Path | None, maxlen: int = 400) -> None:
        self.lines: collections.deque[str] = collections.deque(maxlen=maxlen)
        #: The file really written: ``path``, or ``STEM.PID.log`` when another process holds it.
        self.path = claim_log(path) if path is not None else None
        self._file: IO[str] | None = None
        self._listeners: list[LineListener] = []
        self.total_lines = 0
        if self.path is not None:
            try:
                self._file = self.path.open("a", encoding="utf-8", errors="replace", buffering=1)
            except OSError:
                release_log(self.path)
                raise

    def subscribe(self, listener: LineListener) -> Callable[[], None]:
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener) if listener in self._listeners else None

    def add(self, line: str) -> None:
        self.add_lines((line,))

    def add_lines(self, lines: Sequence[str]) -> None:
        """Lines read together: one write to the file (it is line-buffered: one flush), then
        every listener sees each line."""
        if not lines:
            return
        self.lines.extend(lines)
        self.total_lines += len(lines)
        if self._file is not None:
            with contextlib.suppress(OSError, ValueError):  # disk full / closed: the ring still has it
                self._file.write("\n".join(lines) + "\n")
        for listener in list(self._listeners):
            for line in lines:
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
            if self.path is not None:
                release_log(self.path)


def without_idle(lines: Iterable[str]) -> Iterator[str]:
    """``lines`` with each run of idle lines (:data:`IDLE_LINE_RE`) collapsed into one note."""
    idle = 0
    for line in lines:
        if IDLE_LINE_RE.search(line):
            idle += 1
            continue
        if idle:
            yield _idle_note(idle)
            idle = 0
        yield line
    if idle:
        yield _idle_note(idle)


def _idle_note(n: int) -> str:
    return f"[forge] ({n} idle line{'s' if n > 1 else ''} 'all slots are idle' hidden)"


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
