"""One writer process per log file (``LogRing``'s claim) and the idle-line collapse of ``forge logs``.

The other writer is a real second Python process holding a ring on the same path, as a private
``forge load`` or a second ``forge worker`` would."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio
import anyio.abc
import pytest

from rocmforge_supervisor.process import LogRing, without_idle
from rocmforge_supervisor.process._logs import line_blocks_of

HOLDER = """
import sys
from pathlib import Path
from rocmforge_supervisor.process import LogRing
ring = LogRing(Path(sys.argv[1]))
ring.add("from the other process")
print(ring.path, flush=True)
sys.stdin.read()  # hold the file until the test closes our stdin
ring.close()
"""


@contextmanager
def other_process_writing(path: Path) -> Iterator[Path]:
    """A second process with a LogRing open on ``path``; yields the file it really writes."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        yield Path(proc.stdout.readline().strip())
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)
        proc.stdout.close()
    assert proc.returncode == 0


def test_a_file_another_process_writes_is_left_to_it(tmp_path: Path) -> None:
    path = tmp_path / "logs" / "m.log"
    with other_process_writing(path) as theirs:
        assert theirs == path
        ring = LogRing(path)
        try:
            assert ring.path == path.with_name(f"m.{os.getpid()}.log")
            ring.add("from this process")
        finally:
            ring.close()
    assert path.read_text() == "from the other process\n"
    assert (tmp_path / "logs" / f"m.{os.getpid()}.log").read_text() == "from this process\n"


def test_rings_of_one_process_share_the_file_and_a_dead_writer_frees_it(tmp_path: Path) -> None:
    path = tmp_path / "m.log"
    with other_process_writing(path):
        pass  # it exited: its claim is gone with it
    first = LogRing(path)
    second = LogRing(path)  # a model's next child while the previous one stops
    assert first.path == second.path == path
    first.add("a")
    first.close()
    second.add("b")
    with other_process_writing(path) as theirs:
        assert theirs != path  # still ours: the second ring holds it
    second.close()
    with other_process_writing(path) as theirs:
        assert theirs == path  # released with the last ring
    other = "from the other process"
    assert path.read_text().splitlines() == [other, "a", "b", other]


def test_idle_runs_collapse_into_one_note() -> None:
    idle = "0.07.912.766 I srv  update_slots: all slots are idle"
    lines = ["loaded", idle, idle, idle, "request", idle, "slot done", idle, idle]
    assert list(without_idle(lines)) == [
        "loaded",
        "[forge] (3 idle lines 'all slots are idle' hidden)",
        "request",
        "[forge] (1 idle line 'all slots are idle' hidden)",
        "slot done",
        "[forge] (2 idle lines 'all slots are idle' hidden)",
    ]
    assert list(without_idle(["a", "b"])) == ["a", "b"]


def test_lines_read_together_are_one_write_and_every_listener_sees_each(tmp_path: Path) -> None:
    """``add_lines`` (a read's lines, issue 21): the ring and the file get them in order, each
    listener each line, and ``forge logs`` (the file) has them at once (one flushed write)."""
    ring = LogRing(tmp_path / "m.log", maxlen=3)
    seen: list[str] = []
    ring.subscribe(seen.append)
    try:
        ring.add("first")
        ring.add_lines(["a", "b", "c"])
        ring.add_lines([])
        assert (tmp_path / "m.log").read_text() == "first\na\nb\nc\n"
        assert seen == ["first", "a", "b", "c"]
        assert ring.tail(5) == ["a", "b", "c"] and ring.total_lines == 4
    finally:
        ring.close()


@pytest.mark.anyio
async def test_a_pipe_read_in_pieces_comes_out_as_whole_lines_per_read() -> None:
    """``line_blocks_of``: what one read completes is one block; a line split across reads is
    joined; the unterminated last line comes at the end."""
    reads = [b"one\ntw", b"o\nthree\nfo", b"ur", b"\nfive"]

    async def pipe() -> anyio.abc.ByteReceiveStream:
        send, receive = anyio.create_memory_object_stream[bytes](len(reads))
        for r in reads:
            send.send_nowait(r)
        send.close()
        return _Bytes(receive)

    ticks: list[int] = []
    async with await pipe() as stream:
        blocks = [b async for b in line_blocks_of(stream, on_chunk=lambda: ticks.append(1))]
    assert blocks == [["one"], ["two", "three"], ["four"], ["five"]]
    assert len(ticks) == len(reads)  # every read counts as output, newline or not


class _Bytes(anyio.abc.ByteReceiveStream):
    """A memory stream as the byte stream a child's pipe is (``receive`` raises EndOfStream)."""

    def __init__(self, inner: anyio.abc.ObjectReceiveStream[bytes]) -> None:
        self.inner = inner

    async def receive(self, max_bytes: int = 65536) -> bytes:
        return await self.inner.receive()

    async def aclose(self) -> None:
        await self.inner.aclose()
