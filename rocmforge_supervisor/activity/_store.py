"""The activity log's SQLite file: written by one thread, batched; read by short-lived readers.

Why a thread and a queue: a request's record is handed over with one ``SimpleQueue.put`` on the
event loop (no disk, no lock held across an ``await``), and the writer commits whatever has
gathered in one transaction, so the relay's cost per request does not move with the log on.
WAL lets readers (``/api/activity``, ``/api/usage``) read while the writer writes.

The log is not worth an outage: a file that cannot be opened or written (corrupt, locked by
another process, a full disk) leaves the service serving. :attr:`ActivityStore.problem` says what
is wrong (``/ready`` shows it, ``forge doctor`` names the fix), records are dropped meanwhile, and
each later batch tries again.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ._assemble import assembled_text
from ._record import Record

__all__ = ["USAGE_GROUPS", "ActivityStore", "database_problem"]

log = logging.getLogger("rocmforge.activity")

#: ``/api/usage?by=``: the column each grouping sums over.
USAGE_GROUPS = {"key": "key", "model": "model"}

_SCHEMA = """
CREATE TABLE IF NOT EXISTS requests (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    started REAL NOT NULL,
    request_id TEXT,
    method TEXT,
    route TEXT NOT NULL,
    model TEXT,
    key TEXT,
    client TEXT,
    status INTEGER NOT NULL,
    error TEXT,
    prompt_tokens INTEGER,
    completion_tokens INTEGER,
    cached_tokens INTEGER,
    queue_wait REAL,
    ttft REAL,
    duration REAL,
    tokens_per_second REAL,
    finish_reason TEXT,
    cancelled INTEGER NOT NULL DEFAULT 0,
    stream INTEGER NOT NULL DEFAULT 0,
    request_body TEXT,
    response_body TEXT,
    priority TEXT
);
CREATE INDEX IF NOT EXISTS requests_started ON requests(started);
CREATE INDEX IF NOT EXISTS requests_model ON requests(model, id);
CREATE INDEX IF NOT EXISTS requests_key ON requests(key, id);
"""

_COLUMNS = (
    "started, request_id, method, route, model, key, client, status, error, prompt_tokens, "
    "completion_tokens, cached_tokens, queue_wait, ttft, duration, tokens_per_second, finish_reason, "
    "cancelled, stream, request_body, response_body, priority"
)
_INSERT = f"INSERT INTO requests ({_COLUMNS}) VALUES ({', '.join('?' * 22)})"
#: What a listing returns: everything but the bodies, and whether there are any.
_LISTED = (
    "id, " + _COLUMNS.replace(", request_body, response_body", "") + ", "
    "(request_body IS NOT NULL OR response_body IS NOT NULL) AS captured"
)
#: A batch prunes by age and count only every this many inserts (a DELETE per batch is waste).
_PRUNE_EVERY = 500


class _Flush:
    """A marker in the queue: set once every record before it is committed."""

    def __init__(self) -> None:
        self.done = threading.Event()


_STOP = object()


class ActivityStore:
    """``<state_dir>/activity.db``: :meth:`submit` from the loop, queries from worker threads."""

    def __init__(self, path: Path, *, keep_days: float, max_rows: int, capture_max_bytes: int) -> None:
        self.path = path
        self.keep_days = keep_days
        self.max_rows = max_rows
        self.capture_max_bytes = capture_max_bytes
        #: None while the log works; else one line saying what is wrong with it.
        self.problem: str | None = None
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._since_prune = 0

    # -- the writer ---------------------------------------------------------------------------------

    def start(self) -> None:
        """Open (or create) the file and start the writer; a bad file is reported, not raised."""
        conn = self._connect()
        if conn is not None:
            self._prune(conn)
        self._thread = threading.Thread(
            target=self._write_loop, args=(conn,), name="activity-log", daemon=True
        )
        self._thread.start()

    def submit(self, record: Record) -> None:
        """Hand one finished request to the writer (never blocks, never raises)."""
        self._queue.put(record)

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait (a worker thread's wait) until every record submitted so far is committed."""
        if self._thread is None or not self._thread.is_alive():
            return False
        marker = _Flush()
        self._queue.put(marker)
        return marker.done.wait(timeout)

    def close(self, timeout: float = 5.0) -> None:
        """Commit what is queued and stop the writer."""
        if self._thread is not None and self._thread.is_alive():
            self._queue.put(_STOP)
            self._thread.join(timeout)

    def _connect(self) -> sqlite3.Connection | None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(self.path, timeout=2.0, check_same_thread=False, isolation_level=None)
            try:
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=NORMAL")
                conn.executescript(_SCHEMA)
                _add_priority(conn)
            except BaseException:
                conn.close()
                raise
        except (sqlite3.Error, OSError) as exc:
            self._fail(exc)
            return None
        if self.problem is not None:
            log.warning("activity log %s works again", self.path)
        self.problem = None
        return conn

    def _fail(self, exc: BaseException) -> None:
        problem = f"the activity log {self.path} cannot be used: {exc}"
        if problem != self.problem:
            log.error("%s; requests are served but not logged — run `forge doctor` for the fix", problem)
        self.problem = problem

    def _write_loop(self, conn: sqlite3.Connection | None) -> None:
        stop = False
        while not stop:
            batch = [self._queue.get()]
            with contextlib.suppress(queue.Empty):
                while len(batch) < 512:
                    batch.append(self._queue.get_nowait())
            records = [r for r in batch if isinstance(r, Record)]
            stop = any(r is _STOP for r in batch)
            try:
                if records:
                    if conn is None:
                        conn = self._connect()
                    if conn is not None and not self._insert(conn, records):
                        conn.close()
                        conn = None
            except Exception as exc:  # a bug here must not stop the writer (the queue would grow)
                log.exception("activity log: %d records lost", len(records))
                self._fail(exc)
            for r in batch:
                if isinstance(r, _Flush):
                    r.done.set()
        if conn is not None:
            conn.close()

    def _insert(self, conn: sqlite3.Connection, records: list[Record]) -> bool:
        try:
            conn.execute("BEGIN")
            conn.executemany(_INSERT, [self._row(r) for r in records])
            conn.execute("COMMIT")
        except (sqlite3.Error, OSError) as exc:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            self._fail(exc)
            return False
        self._since_prune += len(records)
        if self._since_prune >= _PRUNE_EVERY:
            self._prune(conn)
        return True

    def _prune(self, conn: sqlite3.Connection) -> None:
        """Keep ``keep_days`` and at most ``max_rows`` rows (the newest)."""
        self._since_prune = 0
        try:
            conn.execute("DELETE FROM requests WHERE started < ?", (time.time() - self.keep_days * 86400,))
            conn.execute(
                "DELETE FROM requests WHERE id <= "
                "(SELECT id FROM requests ORDER BY id DESC LIMIT 1 OFFSET ?)",
                (self.max_rows,),
            )
        except sqlite3.Error as exc:
            self._fail(exc)

    def _row(self, r: Record) -> tuple[Any, ...]:
        return (
            r.started,
            r.request_id,
            r.method,
            r.route,
            r.model,
            r.key,
            r.client,
            r.status,
            r.error,
            r.prompt_tokens,
            r.completion_tokens,
            r.cached_tokens,
            r.queue_wait,
            r.ttft,
            r.duration,
            r.tokens_per_second,
            r.finish_reason,
            int(r.cancelled),
            int(r.stream),
            self._cut(r.request_body),
            self._cut(assembled_text(r.response_body) if r.stream and r.response_body else r.response_body),
            r.priority,
        )

    def _cut(self, body: bytes | str | None) -> str | None:
        """A captured body as text, at most ``capture_max_bytes`` (cut on a character boundary)."""
        if body is None:
            return None
        raw = body.encode() if isinstance(body, str) else body
        text = raw[: self.capture_max_bytes].decode("utf-8", "ignore")
        return text + (" …[cut]" if len(raw) > self.capture_max_bytes else "")

    # -- the readers --------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _reader(self) -> Iterator[sqlite3.Connection]:
        conn = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=2.0)
        conn.row_factory = sqlite3.Row
        try:
            yield conn
        finally:
            conn.close()

    def rows(
        self,
        *,
        model: str | None = None,
        key: str | None = None,
        status: int | None = None,
        after: int | None = None,
        limit: int = 100,
    ) -> list[dict[str, Any]]:
        """The newest rows first (``after``: only rows with a greater id), without bodies."""
        where, args = [], []
        for column, value in (("model", model), ("key", key), ("status", status)):
            if value is not None:
                where.append(f"{column} = ?")
                args.append(value)
        if after is not None:
            where.append("id > ?")
            args.append(after)
        sql = f"SELECT {_LISTED} FROM requests"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY id DESC LIMIT ?"
        with self._reader() as conn:
            return [_plain(row) for row in conn.execute(sql, (*args, limit))]

    def row(self, ident: int) -> dict[str, Any] | None:
        """One row with its captured bodies (``None`` when there is no such row)."""
        with self._reader() as conn:
            found = conn.execute(f"SELECT id, {_COLUMNS} FROM requests WHERE id = ?", (ident,)).fetchone()
        return _plain(found) if found is not None else None

    def usage(self, by: str, since: float) -> list[dict[str, Any]]:
        """Requests and tokens per key name (or model) since ``since`` (Unix time)."""
        column = USAGE_GROUPS[by]
        sql = (
            f"SELECT {column} AS name, COUNT(*) AS requests, "
            "COALESCE(SUM(prompt_tokens), 0) AS prompt_tokens, "
            "COALESCE(SUM(completion_tokens), 0) AS completion_tokens, "
            "SUM(status >= 400) AS errors "
            f"FROM requests WHERE started >= ? GROUP BY {column} ORDER BY requests DESC"
        )
        with self._reader() as conn:
            out = [_plain(row) for row in conn.execute(sql, (since,))]
        for row in out:
            row[by] = row.pop("name")
            row["total_tokens"] = row["prompt_tokens"] + row["completion_tokens"]
        return out

    def tokens_since(self, since: float) -> dict[str, list[tuple[float, int]]]:
        """Each key name's (time, tokens) since ``since``: the daily limits' state after a restart."""
        sql = (
            "SELECT key, started, COALESCE(prompt_tokens, 0) + COALESCE(completion_tokens, 0) "
            "FROM requests WHERE started >= ? AND key IS NOT NULL ORDER BY started"
        )
        out: dict[str, list[tuple[float, int]]] = {}
        with self._reader() as conn:
            for key, started, tokens in conn.execute(sql, (since,)):
                if tokens:
                    out.setdefault(key, []).append((started, tokens))
        return out


def database_problem(path: Path) -> tuple[str, str] | None:
    """(what is wrong, the fix) with the activity log at ``path``, or None when it is fine or
    not there yet: what ``forge doctor`` says, and what a service that logs nothing was told."""
    if not path.exists():
        return None
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=1.0)
        try:
            verdict = conn.execute("PRAGMA quick_check").fetchone()[0]
        finally:
            conn.close()
    except sqlite3.OperationalError as exc:
        if "locked" in str(exc):
            return (
                f"the activity log {path} is locked by another process",
                "stop the other process that holds it (another forge serve on the same state dir?)",
            )
        verdict = str(exc)
    except sqlite3.DatabaseError as exc:
        verdict = str(exc)
    if verdict == "ok":
        return None
    return (
        f"the activity log {path} is damaged ({verdict}): forge serves but logs no requests",
        f"move it aside (mv {path} {path}.broken; forge starts a new one), or try `sqlite3 {path} .recover`",
    )


def _plain(row: sqlite3.Row) -> dict[str, Any]:
    out = dict(row)
    for flag in ("cancelled", "stream", "captured"):
        if flag in out:
            out[flag] = bool(out[flag])
    return out


def _add_priority(conn: sqlite3.Connection) -> None:
    """A log written before admission classes existed gets their column (NULL in its old rows)."""
    columns = {row[1] for row in conn.execute("PRAGMA table_info(requests)")}
    if "priority" not in columns:
        conn.execute("ALTER TABLE requests ADD COLUMN priority TEXT")
