"""Service logging: journald lines (no timestamp, <N> priorities), JSON lines, request ids."""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

import anyio
import pytest

from rocmforge_supervisor.config import ForgeSettings
from rocmforge_supervisor.service.core._logging import connected_to_journal, request_id_var, setup_logging

log = logging.getLogger("rocmforge_supervisor.test")


@pytest.fixture(autouse=True)
def restore_root_logger() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for h in list(root.handlers):
        if h not in handlers:
            root.removeHandler(h)
            h.close()
    root.setLevel(level)


@pytest.fixture
def out(tmp_path: Path) -> Iterator[TextIO]:
    """A real file standing in for stderr (it has a device and an inode, as journald's socket does)."""
    with (tmp_path / "stderr.log").open("w+", encoding="utf-8") as fh:
        yield fh


def journal_settings(stream: TextIO) -> ForgeSettings:
    st = os.fstat(stream.fileno())
    return ForgeSettings.model_validate({"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"})


def lines(stream: TextIO) -> list[str]:
    for h in logging.getLogger().handlers:
        h.flush()
    stream.seek(0)
    return stream.read().splitlines()


def test_journal_mode_has_priorities_and_no_timestamp(out: TextIO) -> None:
    settings = journal_settings(out)
    assert connected_to_journal(settings, out)
    setup_logging("text", settings, level=logging.DEBUG, stream=out)
    log.debug("dbg")
    log.info("model %s ready", "gemma")
    log.warning("slow")
    log.error("crashed")
    log.critical("gone")
    got = lines(out)
    assert got == [
        "<7>rocmforge_supervisor.test: dbg",
        "<6>rocmforge_supervisor.test: model gemma ready",
        "<4>rocmforge_supervisor.test: slow",
        "<3>rocmforge_supervisor.test: crashed",
        "<2>rocmforge_supervisor.test: gone",
    ]
    assert not any(re.search(r"\d{2}:\d{2}:\d{2}", line) for line in got)


def test_journal_mode_prefixes_every_line_of_a_traceback(out: TextIO) -> None:
    setup_logging("text", journal_settings(out), stream=out)
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        log.exception("request failed")
    got = lines(out)
    assert len(got) > 3
    assert all(line.startswith("<3>") for line in got)
    assert got[-1] == "<3>RuntimeError: boom"


def test_inherited_journal_stream_is_not_trusted(out: TextIO, tmp_path: Path) -> None:
    """A JOURNAL_STREAM for another file (stderr redirected after systemd set it) → normal lines."""
    other = tmp_path / "other"
    other.write_text("")
    st = other.stat()
    settings = ForgeSettings.model_validate({"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"})
    assert not connected_to_journal(settings, out)
    assert not connected_to_journal(ForgeSettings.model_validate({"JOURNAL_STREAM": "garbage"}), out)
    setup_logging("text", settings, stream=out)
    log.info("hello")
    (line,) = lines(out)
    assert not line.startswith("<")
    assert re.match(r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2} INFO +rocmforge_supervisor.test: hello$", line)


def test_json_lines_carry_request_id_and_extras(out: TextIO) -> None:
    setup_logging("json", ForgeSettings(), stream=out)
    log.info("outside a request")
    token = request_id_var.set("req-123")
    try:
        log.info("proxying", extra={"model": "gemma", "status": 200})
        log.warning('quote " and ünïcode')
    finally:
        request_id_var.reset(token)
    log.info("explicit", extra={"request_id": "req-own"})
    objs = [json.loads(line) for line in lines(out)]
    assert len(objs) == 4
    for o in objs:
        assert {"time", "level", "logger", "message"} <= set(o)
        assert o["logger"] == "rocmforge_supervisor.test"
        assert re.match(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}\+00:00$", o["time"])
    assert "request_id" not in objs[0]
    assert objs[1] == {
        **objs[1],
        "message": "proxying",
        "request_id": "req-123",
        "model": "gemma",
        "status": 200,
    }
    assert objs[2]["level"] == "warning" and objs[2]["message"] == 'quote " and ünïcode'
    assert objs[2]["request_id"] == "req-123"
    assert objs[3]["request_id"] == "req-own"


def test_json_exception_is_one_line(out: TextIO) -> None:
    setup_logging("json", ForgeSettings(), stream=out)
    try:
        raise ValueError("bad")
    except ValueError:
        log.exception("failed")
    (line,) = lines(out)
    obj = json.loads(line)
    assert obj["level"] == "error" and "ValueError: bad" in obj["exception"]


def test_request_id_follows_each_task(out: TextIO) -> None:
    """Concurrent requests in one event loop keep their own ids (contextvars are per task)."""
    setup_logging("json", ForgeSettings(), stream=out)

    async def handle(rid: str, started: anyio.Event, go_on: anyio.Event, done: anyio.Event) -> None:
        request_id_var.set(rid)
        log.info("start")
        started.set()
        await go_on.wait()
        log.info("end")
        done.set()

    async def main() -> None:
        with anyio.fail_after(10):
            a_started, b_started, a_done, never = anyio.Event(), anyio.Event(), anyio.Event(), anyio.Event()
            async with anyio.create_task_group() as tg:
                tg.start_soon(handle, "A", a_started, b_started, a_done)
                await a_started.wait()
                tg.start_soon(handle, "B", b_started, never, anyio.Event())
                await a_done.wait()  # A ends after B has set its own id
                tg.cancel_scope.cancel()

    anyio.run(main)
    got = [(o["request_id"], o["message"]) for o in map(json.loads, lines(out))]
    assert got == [("A", "start"), ("B", "start"), ("A", "end")]
    assert request_id_var.get() is None


def test_text_mode_shows_request_id(out: TextIO) -> None:
    setup_logging("text", ForgeSettings(), stream=out)
    token = request_id_var.set("r-9")
    try:
        log.info("hi", extra={"model": "gemma"})
    finally:
        request_id_var.reset(token)
    (line,) = lines(out)
    assert line.endswith("rocmforge_supervisor.test: hi [model=gemma request_id=r-9]")


def test_setup_is_idempotent_and_quiets_httpx(out: TextIO) -> None:
    setup_logging("text", ForgeSettings(), stream=out)
    setup_logging("json", ForgeSettings(), stream=out)
    ours = [h for h in logging.getLogger().handlers if getattr(h, "_forge_handler", False)]
    assert len(ours) == 1
    logging.getLogger("httpx").info("HTTP Request: POST http://127.0.0.1/v1/chat/completions")
    log.info("kept")
    assert [json.loads(line)["message"] for line in lines(out)] == ["kept"]


def test_a_task_started_by_a_request_forgets_its_id_when_the_request_ends(out: TextIO) -> None:
    """A load a request triggered runs in a long-lived task that copied the request's context: its
    later lines (shutdown ones included) must not carry the finished request's id."""
    setup_logging("json", ForgeSettings(), stream=out)

    async def main() -> None:
        with anyio.fail_after(10):
            request_over, logged, first = anyio.Event(), anyio.Event(), anyio.Event()

            async def long_lived() -> None:  # e.g. a model's supervision task
                log.info("while the request runs")
                first.set()
                await request_over.wait()
                log.info("stopping llama-server")
                logged.set()

            async def request(tg: anyio.abc.TaskGroup) -> None:
                request_id_var.set("req-1")
                log.info("handling")
                tg.start_soon(long_lived)  # copies this context
                await first.wait()  # it logs while the request is still running

            async with anyio.create_task_group() as tg:
                async with anyio.create_task_group() as req:
                    req.start_soon(request, tg)
                request_over.set()
                await logged.wait()

    anyio.run(main)
    got = [(o.get("request_id"), o["message"]) for o in map(json.loads, lines(out))]
    assert got == [
        ("req-1", "handling"),
        ("req-1", "while the request runs"),
        (None, "stopping llama-server"),
    ]


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_uvicorn_color_message_is_not_a_context_field(out: TextIO, fmt: str) -> None:
    """uvicorn logs with ``extra={"color_message": …}`` (ANSI-coloured copy of the message)."""
    import uvicorn.logging  # noqa: F401  — the real uvicorn, whose loggers add the extra

    setup_logging(fmt, ForgeSettings(), stream=out)  # type: ignore[arg-type]
    logging.getLogger("uvicorn.error").info(
        "Uvicorn running on %s",
        "http://127.0.0.1:1",
        extra={"color_message": "Uvicorn running on \x1b[1m%s\x1b[0m"},
    )
    (line,) = lines(out)
    assert (
        "color_message" not in line and "\x1b" not in line and "Uvicorn running on http://127.0.0.1:1" in line
    )
