"""Logging for ``forge serve``: journald-friendly text, a terminal format, or JSON lines.

Under systemd (stderr really is the journal stream, checked the way sd-daemon(3) says: the
``JOURNAL_STREAM`` device:inode equals stderr's) lines carry no timestamp, since journald adds its
own, and start with a ``<N>`` syslog priority so that ``journalctl -p warning`` works. On a terminal
they are timestamped (rich). ``json`` is one object per line for log shippers.

The HTTP layer sets :data:`request_id_var` for the duration of a request; every line logged while
it is set (by any module) carries ``request_id``, so one request can be followed through the
gateway, the queue and the supervisor. Other ``extra=`` fields (``model``, ``pid``, …) are kept too.
"""

from __future__ import annotations

import asyncio
import contextvars
import datetime as dt
import json
import logging
import os
import sys
from typing import Any, Literal, TextIO

from ...config import ForgeSettings

__all__ = [
    "LogFormat",
    "RequestIdVar",
    "connected_to_journal",
    "relog",
    "request_id_var",
    "setup_logging",
]

LogFormat = Literal["text", "json"]

_Owned = tuple[str, "asyncio.Task[Any] | None"]


class RequestIdVar:
    """A context variable for the request id that forgets it once the request is over.

    A task started while a request is handled (a model load the request triggered, into the
    supervisor's long-lived task group) copies the request's context, and with a plain ContextVar
    it would stamp that request's id on its lines forever, shutdown lines included. So the value
    remembers the asyncio task that set it (the request's task) and reads as None once that task
    is done; the request's own child tasks keep it while the request runs. Same API as
    :class:`contextvars.ContextVar` for ``set``/``get``/``reset``.
    """

    def __init__(self) -> None:
        self._var: contextvars.ContextVar[_Owned | None] = contextvars.ContextVar(
            "forge_request_id", default=None
        )

    def set(self, rid: str | None) -> contextvars.Token[_Owned | None]:
        return self._var.set(None if rid is None else (rid, _current_task()))

    def reset(self, token: contextvars.Token[_Owned | None]) -> None:
        self._var.reset(token)

    def get(self) -> str | None:
        value = self._var.get()
        if value is None:
            return None
        rid, owner = value
        return None if owner is not None and owner.done() else rid


def _current_task() -> asyncio.Task[Any] | None:
    try:
        return asyncio.current_task()
    except RuntimeError:  # no running loop: plain synchronous code, nothing to outlive
        return None


#: The request being handled (set by the HTTP layer; None outside a request, or after it).
request_id_var = RequestIdVar()

#: sd-daemon(3) priorities: <3> err, <4> warning, <6> info, <7> debug.
_SYSLOG_PRIORITY = {
    logging.CRITICAL: 2,
    logging.ERROR: 3,
    logging.WARNING: 4,
    logging.INFO: 6,
    logging.DEBUG: 7,
}

#: Attributes every LogRecord has; anything else on a record came from ``extra=``. uvicorn adds
#: ``color_message`` (the same message with ANSI colours, for its own formatter): not context.
_RECORD_ATTRS = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {
    "message",
    "asctime",
    "color_message",
}

#: Libraries that log every HTTP request at INFO (the gateway makes one per proxied request).
_CHATTY = ("httpx", "httpcore", "hpack")

_MARK = "_forge_handler"


class _RequestIdFilter(logging.Filter):
    """Copies :data:`request_id_var` onto each record (an explicit ``extra`` wins)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "request_id", None) is None:
            record.request_id = request_id_var.get()
        return True


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    return {
        k: v
        for k, v in record.__dict__.items()
        if k not in _RECORD_ATTRS and not k.startswith("_") and v is not None
    }


def _context_suffix(record: logging.LogRecord) -> str:
    extras = _extras(record)
    return " [" + " ".join(f"{k}={v}" for k, v in extras.items()) + "]" if extras else ""


class JournalFormatter(logging.Formatter):
    """``<6>logger: message [request_id=…]``: no timestamp, one priority prefix per line."""

    def format(self, record: logging.LogRecord) -> str:
        prio = _SYSLOG_PRIORITY.get(record.levelno) or _nearest_priority(record.levelno)
        text = f"{record.name}: {record.getMessage()}{_context_suffix(record)}"
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        if record.stack_info:
            text += "\n" + self.formatStack(record.stack_info)
        # journald splits on newlines; each line needs its own prefix or it falls back to info.
        return "\n".join(f"<{prio}>{line}" for line in text.splitlines() or [""])


class TextFormatter(logging.Formatter):
    """A timestamped line for a terminal or a plain file."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s: %(message)s", datefmt="%Y-%m-%d %H:%M:%S")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        head, sep, rest = line.partition("\n")
        return head + _context_suffix(record) + sep + rest


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (UTC, ISO 8601), level, logger, message, then any extras."""

    def format(self, record: logging.LogRecord) -> str:
        obj: dict[str, Any] = {
            "time": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in _extras(record).items():
            obj.setdefault(key, value)
        if record.exc_info:
            obj["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            obj["stack"] = self.formatStack(record.stack_info)
        return json.dumps(obj, default=str, ensure_ascii=False)


def _nearest_priority(levelno: int) -> int:
    for level in sorted(_SYSLOG_PRIORITY, reverse=True):
        if levelno >= level:
            return _SYSLOG_PRIORITY[level]
    return 7


def connected_to_journal(settings: ForgeSettings, stream: TextIO) -> bool:
    """True if ``stream`` is the journald stream systemd gave us (not merely inherited the variable).

    sd-daemon(3): compare ``JOURNAL_STREAM``'s ``<device>:<inode>`` with the stream's own, since a
    child of a service, or a redirected stderr, inherits the variable without the connection.
    """
    if not settings.journal_stream:
        return False
    try:
        dev, ino = (int(part) for part in settings.journal_stream.split(":", 1))
        st = os.fstat(stream.fileno())
    except (ValueError, OSError):
        return False
    return (st.st_dev, st.st_ino) == (dev, ino)


def setup_logging(
    fmt: LogFormat,
    settings: ForgeSettings,
    level: int = logging.INFO,
    *,
    stream: TextIO | None = None,
) -> logging.Handler:
    """Send every logger's records to ``stream`` (stderr) in ``fmt``. Idempotent: a second call
    replaces the handler the first one installed. Returns the handler."""
    out = stream if stream is not None else sys.stderr
    handler: logging.Handler
    if fmt == "json":
        handler = logging.StreamHandler(out)
        handler.setFormatter(JsonFormatter())
    elif connected_to_journal(settings, out):
        handler = logging.StreamHandler(out)
        handler.setFormatter(JournalFormatter())
    elif _isatty(out):
        from rich.console import Console
        from rich.logging import RichHandler

        handler = RichHandler(
            console=Console(file=out, soft_wrap=True),
            show_path=False,
            log_time_format="[%Y-%m-%d %H:%M:%S]",
            rich_tracebacks=False,
        )
        handler.setFormatter(_RichMessage())
    else:
        handler = logging.StreamHandler(out)
        handler.setFormatter(TextFormatter())
    handler.addFilter(_RequestIdFilter())
    setattr(handler, _MARK, (fmt, out))  # what :func:`relog` needs to redo this

    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, _MARK, False)]:
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    root.setLevel(level)
    for name in _CHATTY:
        logging.getLogger(name).setLevel(max(level, logging.WARNING))
    return handler


def relog(fmt: LogFormat, settings: ForgeSettings) -> bool:
    """Switch the handler :func:`setup_logging` installed to ``fmt``, on the same stream and level
    (``server.log_format`` on a reload). False, and nothing done, when there is no such handler
    (forge serve run in-process: its caller owns the logging) or it already writes ``fmt``."""
    root = logging.getLogger()
    ours = [getattr(h, _MARK) for h in root.handlers if getattr(h, _MARK, False)]
    if not ours or ours[-1][0] == fmt:
        return False
    setup_logging(fmt, settings, root.level, stream=ours[-1][1])
    return True


class _RichMessage(logging.Formatter):
    """Rich prints time, level and logger itself; add the request context to the message."""

    def format(self, record: logging.LogRecord) -> str:
        return f"{record.name}: {record.getMessage()}{_context_suffix(record)}" + (
            "\n" + self.formatException(record.exc_info) if record.exc_info else ""
        )


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
