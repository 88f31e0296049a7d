"""The Batch API's records: uploaded files and batches, and each batch line's answer.

``<state_dir>/batches/``: ``batches.db`` (SQLite: files, batches, one row per line) and
``files/<id>`` (the bodies), every file mode 0600, the folder 0700 — prompts and answers are in
them. A line's answer is written to its row the moment it comes, so a service that stops in the
middle resumes with the lines that have none: each line is answered once. The output and error
files are assembled from the rows, in input order, when the batch ends.

The calls are blocking and short (one statement each, under a lock): the routes and the runner
call them on a worker thread.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import sqlite3
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["ENDPOINTS", "WINDOWS", "BatchStore", "Line", "parse_input"]

#: What a batch may call (``endpoint`` and each line's ``url``).
ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
#: ``completion_window`` values and their seconds (OpenAI takes only ``24h``).
WINDOWS = {"24h": 86400.0}
#: A batch in one of these states is over: its files are final.
FINAL = frozenset({"completed", "failed", "cancelled", "expired"})

_SCHEMA = """
CREATE TABLE IF NOT EXISTS files (
    id TEXT PRIMARY KEY,
    owner TEXT,
    purpose TEXT NOT NULL,
    filename TEXT NOT NULL,
    bytes INTEGER NOT NULL,
    created_at INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS batches (
    id TEXT PRIMARY KEY,
    owner TEXT,
    data TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS lines (
    batch_id TEXT NOT NULL,
    idx INTEGER NOT NULL,
    custom_id TEXT NOT NULL,
    request TEXT NOT NULL,
    ok INTEGER,
    result TEXT,
    PRIMARY KEY (batch_id, idx)
);
"""


@dataclass(frozen=True)
class Line:
    """One request of a batch: its index in the input, ``custom_id`` and the request's body."""

    idx: int
    custom_id: str
    body: dict[str, Any]


def parse_input(data: bytes, endpoint: str, max_lines: int) -> tuple[list[Line], list[dict[str, Any]]]:
    """The lines of a batch input file, and the errors that fail the batch (OpenAI's validation:
    a line that is not a request for ``endpoint`` fails the whole batch before any runs; which
    models a key may use is checked per line, later, as its own error line)."""
    lines: list[Line] = []
    errors: list[dict[str, Any]] = []
    seen: set[str] = set()
    for n, raw in enumerate(data.splitlines(), start=1):
        if not raw.strip():
            continue
        problem = None
        try:
            obj = json.loads(raw)
        except ValueError as exc:
            obj, problem = None, f"not JSON: {exc}"
        if problem is None:
            problem = _line_problem(obj, endpoint, seen)
        if problem is not None:
            errors.append({"code": "invalid_request", "message": problem, "param": None, "line": n})
            continue
        assert isinstance(obj, dict)
        seen.add(obj["custom_id"])
        lines.append(Line(len(lines), obj["custom_id"], obj["body"]))
    if not lines and not errors:
        errors.append(
            {"code": "empty_file", "message": "the input file has no requests", "param": None, "line": None}
        )
    if len(lines) > max_lines:
        errors.append(
            {
                "code": "too_many_requests",
                "message": f"the input file has {len(lines)} requests; the limit is {max_lines} (server.batch_max_lines)",
                "param": None,
                "line": None,
            }
        )
    return lines, errors


def _line_problem(obj: Any, endpoint: str, seen: set[str]) -> str | None:
    if not isinstance(obj, dict):
        return "a line must be a JSON object with custom_id, method, url and body"
    cid = obj.get("custom_id")
    if not isinstance(cid, str) or not cid:
        return 'the line has no "custom_id" (a string)'
    if cid in seen:
        return f"custom_id {cid!r} is used twice"
    if obj.get("method", "POST") != "POST":
        return f"method must be POST, not {obj.get('method')!r}"
    if obj.get("url") != endpoint:
        return f"url {obj.get('url')!r} is not the batch's endpoint {endpoint!r}"
    if not isinstance(obj.get("body"), dict):
        return 'the line has no "body" (a JSON object)'
    return None


class BatchStore:
    """``<state_dir>/batches``: records in SQLite, bodies in files (see the module docstring)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.files_dir = root / "files"
        old = os.umask(0o077)
        try:
            self.files_dir.mkdir(parents=True, exist_ok=True)
            root.chmod(0o700)
            self._conn = sqlite3.connect(root / "batches.db", check_same_thread=False, isolation_level=None)
        finally:
            os.umask(old)
        (root / "batches.db").chmod(0o600)
        self._conn.row_factory = sqlite3.Row
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.executescript(_SCHEMA)
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    @contextlib.contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._conn.execute("BEGIN")
            try:
                yield self._conn
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    # -- files -----------------------------------------------------------------------------------

    def add_file(self, data: bytes, *, filename: str, purpose: str, owner: str | None) -> dict[str, Any]:
        fid = "file-" + secrets.token_hex(12)
        path = self.files_dir / fid
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        created = int(time.time())
        with self._tx() as c:
            c.execute(
                "INSERT INTO files (id, owner, purpose, filename, bytes, created_at) VALUES (?, ?, ?, ?, ?, ?)",
                (fid, owner, purpose, filename, len(data), created),
            )
        return self.file(fid) or {}

    def file(self, fid: str) -> dict[str, Any] | None:
        with self._lock:
            row = self._conn.execute("SELECT * FROM files WHERE id = ?", (fid,)).fetchone()
        return _file_json(row) if row is not None else None

    def file_owner(self, fid: str) -> tuple[bool, str | None]:
        """(whether it exists, its owner's key name)."""
        with self._lock:
            row = self._conn.execute("SELECT owner FROM files WHERE id = ?", (fid,)).fetchone()
        return (row is not None, row["owner"] if row is not None else None)

    def files(self, owner: str | None, *, every: bool, purpose: str | None = None) -> list[dict[str, Any]]:
        sql, args = "SELECT * FROM files", []
        where = []
        if not every:
            where.append("owner IS ?")
            args.append(owner)
        if purpose:
            where.append("purpose = ?")
            args.append(purpose)
        if where:
            sql += " WHERE " + " AND ".join(where)
        with self._lock:
            rows = self._conn.execute(sql + " ORDER BY created_at DESC, rowid DESC", args).fetchall()
        return [_file_json(r) for r in rows]

    def content(self, fid: str) -> bytes:
        return (self.files_dir / fid).read_bytes()

    def delete_file(self, fid: str) -> None:
        with self._tx() as c:
            c.execute("DELETE FROM files WHERE id = ?", (fid,))
        (self.files_dir / fid).unlink(missing_ok=True)

    # -- batches ---------------------------------------------------------------------------------

    def create_batch(
        self,
        *,
        owner: str | None,
        input_file_id: str,
        endpoint: str,
        window: str,
        metadata: dict[str, Any] | None,
        lines: list[Line],
        errors: list[dict[str, Any]],
    ) -> dict[str, Any]:
        now = int(time.time())
        bid = "batch_" + secrets.token_hex(12)
        failed = bool(errors)
        data: dict[str, Any] = {
            "id": bid,
            "object": "batch",
            "endpoint": endpoint,
            "errors": {"object": "list", "data": errors} if errors else None,
            "input_file_id": input_file_id,
            "completion_window": window,
            "status": "failed" if failed else "in_progress",
            "output_file_id": None,
            "error_file_id": None,
            "created_at": now,
            "in_progress_at": None if failed else now,
            "expires_at": now + int(WINDOWS[window]),
            "finalizing_at": None,
            "completed_at": None,
            "failed_at": now if failed else None,
            "expired_at": None,
            "cancelling_at": None,
            "cancelled_at": None,
            "request_counts": {"total": 0 if failed else len(lines), "completed": 0, "failed": 0},
            "metadata": metadata,
        }
        with self._tx() as c:
            c.execute(
                "INSERT INTO batches (id, owner, data) VALUES (?, ?, ?)", (bid, owner, json.dumps(data))
            )
            if not failed:
                c.executemany(
                    "INSERT INTO lines (batch_id, idx, custom_id, request) VALUES (?, ?, ?, ?)",
                    [(bid, ln.idx, ln.custom_id, json.dumps(ln.body)) for ln in lines],
                )
        return data

    def batch(self, bid: str) -> tuple[dict[str, Any], str | None] | None:
        """(the batch's JSON, its owner) or None."""
        with self._lock:
            row = self._conn.execute("SELECT owner, data FROM batches WHERE id = ?", (bid,)).fetchone()
        return (json.loads(row["data"]), row["owner"]) if row is not None else None

    def batches(self, owner: str | None, *, every: bool) -> list[dict[str, Any]]:
        sql, args = "SELECT data FROM batches", []
        if not every:
            sql += " WHERE owner IS ?"
            args.append(owner)
        with self._lock:
            rows = self._conn.execute(sql + " ORDER BY rowid DESC", args).fetchall()
        return [json.loads(r["data"]) for r in rows]

    def active(self) -> list[tuple[dict[str, Any], str | None]]:
        """The batches not yet over (in progress, finalizing or cancelling), oldest first."""
        with self._lock:
            rows = self._conn.execute("SELECT owner, data FROM batches ORDER BY rowid").fetchall()
        out = []
        for r in rows:
            data = json.loads(r["data"])
            if data["status"] not in FINAL:
                out.append((data, r["owner"]))
        return out

    def update(self, data: dict[str, Any]) -> None:
        with self._tx() as c:
            c.execute("UPDATE batches SET data = ? WHERE id = ?", (json.dumps(data), data["id"]))

    def cancel(self, bid: str) -> dict[str, Any]:
        """Batch ``bid`` to ``cancelling`` (the runner ends it ``cancelled``), unless it ended."""
        with self._tx() as c:
            data = json.loads(c.execute("SELECT data FROM batches WHERE id = ?", (bid,)).fetchone()["data"])
            if data["status"] not in FINAL and data["status"] != "cancelling":
                data["status"] = "cancelling"
                data["cancelling_at"] = int(time.time())
                c.execute("UPDATE batches SET data = ? WHERE id = ?", (json.dumps(data), bid))
        return dict(data)

    def pending(self, bid: str, limit: int) -> list[Line]:
        """Lines of batch ``bid`` without an answer yet, in input order."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT idx, custom_id, request FROM lines WHERE batch_id = ? AND ok IS NULL ORDER BY idx LIMIT ?",
                (bid, limit),
            ).fetchall()
        return [Line(r["idx"], r["custom_id"], json.loads(r["request"])) for r in rows]

    def answer(self, bid: str, idx: int, *, ok: bool, result: dict[str, Any]) -> dict[str, int]:
        """Record line ``idx``'s answer (once: a second answer to it is ignored); returns the
        batch's ``request_counts`` as they are now, stored with it."""
        with self._tx() as c:
            cur = c.execute(
                "UPDATE lines SET ok = ?, result = ? WHERE batch_id = ? AND idx = ? AND ok IS NULL",
                (int(ok), json.dumps(result), bid, idx),
            )
            counts = _counts(c, bid)
            if cur.rowcount:
                row = c.execute("SELECT data FROM batches WHERE id = ?", (bid,)).fetchone()
                data = json.loads(row["data"])
                data["request_counts"] = counts
                c.execute("UPDATE batches SET data = ? WHERE id = ?", (json.dumps(data), bid))
        return counts

    def finish(self, data: dict[str, Any], status: str, owner: str | None) -> dict[str, Any]:
        """End batch ``data`` in ``status``: its output and error files written from the answers
        (in input order; a file only when it has a line), its counts and times set."""
        bid = data["id"]
        now = int(time.time())
        with self._lock:
            rows = self._conn.execute(
                "SELECT ok, result FROM lines WHERE batch_id = ? AND ok IS NOT NULL ORDER BY idx", (bid,)
            ).fetchall()
            counts = _counts(self._conn, bid)
        out = [r["result"] for r in rows if r["ok"]]
        err = [r["result"] for r in rows if not r["ok"]]
        if out and data.get("output_file_id") is None:
            data["output_file_id"] = self._output(out, bid, "output", owner)
        if err and data.get("error_file_id") is None:
            data["error_file_id"] = self._output(err, bid, "error", owner)
        data["request_counts"] = counts
        data["status"] = status
        data[{"completed": "completed_at", "cancelled": "cancelled_at", "expired": "expired_at"}[status]] = (
            now
        )
        self.update(data)
        return data

    def _output(self, lines: list[str], bid: str, kind: str, owner: str | None) -> str:
        body = ("\n".join(lines) + "\n").encode()
        return str(
            self.add_file(body, filename=f"{bid}_{kind}.jsonl", purpose="batch_output", owner=owner)["id"]
        )


def _counts(c: sqlite3.Connection, bid: str) -> dict[str, int]:
    row = c.execute(
        "SELECT COUNT(*) AS total, COALESCE(SUM(ok = 1), 0) AS completed, COALESCE(SUM(ok = 0), 0) AS failed "
        "FROM lines WHERE batch_id = ?",
        (bid,),
    ).fetchone()
    return {"total": row["total"], "completed": row["completed"], "failed": row["failed"]}


def _file_json(row: sqlite3.Row) -> dict[str, Any]:
    return {
        "id": row["id"],
        "object": "file",
        "bytes": row["bytes"],
        "created_at": row["created_at"],
        "filename": row["filename"],
        "purpose": row["purpose"],
        "status": "processed",
        "status_details": None,
        "expires_at": None,
    }
