"""The activity store on its own: rows written by its thread, kept by age and count, read back,
kept across a reopen; a file that is not a database leaves it reporting, not raising."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

from rocmforge_supervisor.activity import ActivityStore, Record, assembled_text


def _store(path: Path, **kw: object) -> ActivityStore:
    opts: dict[str, object] = {"keep_days": 30.0, "max_rows": 1000, "capture_max_bytes": 64}
    opts.update(kw)
    store = ActivityStore(path, **opts)  # type: ignore[arg-type]
    store.start()
    return store


def _record(**kw: object) -> Record:
    base: dict[str, object] = {"started": time.time(), "route": "/v1/chat/completions", "status": 200}
    base.update(kw)
    return Record(**base)  # type: ignore[arg-type]


def test_rows_are_written_read_back_and_survive_a_reopen(tmp_path: Path) -> None:
    db = tmp_path / "activity.db"
    store = _store(db)
    store.submit(_record(model="a", key="ci", prompt_tokens=3, completion_tokens=5))
    store.submit(_record(model="b", key="ops", status=429, error="RateLimited"))
    assert store.flush()
    rows = store.rows()
    assert [r["model"] for r in rows] == ["b", "a"]  # newest first
    assert rows[1]["prompt_tokens"] == 3 and rows[0]["error"] == "RateLimited"
    assert store.rows(key="ci")[0]["model"] == "a" and store.rows(status=429)[0]["key"] == "ops"
    store.close()
    assert sqlite3.connect(db).execute("PRAGMA journal_mode").fetchone()[0] == "wal"

    again = _store(db)
    assert [r["model"] for r in again.rows()] == ["b", "a"]
    usage = {r["key"]: r for r in again.usage("key", 0)}
    assert usage["ci"]["total_tokens"] == 8 and usage["ops"]["errors"] == 1
    again.close()


def test_rows_are_kept_by_count_and_by_age(tmp_path: Path) -> None:
    db = tmp_path / "activity.db"
    store = _store(db, max_rows=3, keep_days=1.0)
    store.submit(_record(model="old", started=time.time() - 2 * 86400))
    for i in range(5):
        store.submit(_record(model=f"m{i}"))
    store.close()
    again = _store(db, max_rows=3, keep_days=1.0)  # pruned when opened, then every few hundred rows
    assert [r["model"] for r in again.rows()] == ["m4", "m3", "m2"]
    again.close()


def test_a_captured_stream_is_kept_as_its_text_and_cut_at_capture_max_bytes(tmp_path: Path) -> None:
    store = _store(tmp_path / "activity.db", capture_max_bytes=64)
    stream = b"".join(
        b"data: " + json.dumps({"choices": [{"delta": {"content": w}}]}).encode() + b"\n\n"
        for w in ("Hello", " world")
    )
    stream += b'data: {"choices":[],"usage":{"prompt_tokens":2,"completion_tokens":2}}\n\ndata: [DONE]\n\n'
    store.submit(_record(stream=True, request_body=b"x" * 100, response_body=stream))
    store.flush()
    row = store.row(store.rows()[0]["id"])
    store.close()
    assert row is not None
    assert row["response_body"].startswith("Hello world\n[usage] ")
    assert row["request_body"] == "x" * 64 + " …[cut]"


def test_assembled_text_knows_every_dialect() -> None:
    anthropic = (
        b'event: content_block_delta\ndata: {"type":"content_block_delta","delta":{"text":"Hi"}}\n\n'
        b'event: message_delta\ndata: {"type":"message_delta","usage":{"output_tokens":1}}\n\n'
    )
    assert assembled_text(anthropic) == 'Hi\n[usage] {"output_tokens":1}'
    ollama = b'{"message":{"content":"a"}}\n{"message":{"content":"b"},"done":true,"eval_count":2}\n'
    assert assembled_text(ollama) == 'ab\n[usage] {"eval_count":2}'
    assert assembled_text(b'data: {"content":"x","stop":false}\n\n') == "x"  # llama-server's native
    assert assembled_text(b"data: not json\n\n: keep-alive\n\n") == ""


def test_a_file_that_is_not_a_database_is_reported_and_nothing_raises(tmp_path: Path) -> None:
    db = tmp_path / "activity.db"
    db.write_bytes(b"this is not a database" * 100)
    store = _store(db)
    assert store.problem is not None and str(db) in store.problem and "not a database" in store.problem
    store.submit(_record())  # dropped, not raised
    assert store.flush()
    store.close()
    assert db.read_bytes().startswith(b"this is not a database")  # left for the user to look at


def test_doctor_names_the_fix_for_a_damaged_log(tmp_path: Path) -> None:
    from rocmforge_supervisor.activity import database_problem

    db = tmp_path / "activity.db"
    assert database_problem(db) is None  # not there yet
    store = _store(db)
    store.close()
    assert database_problem(db) is None
    db.write_bytes(b"garbage" * 1000)
    problem = database_problem(db)
    assert problem is not None
    what, fix = problem
    assert str(db) in what and "damaged" in what and f"mv {db} {db}.broken" in fix


def test_a_locked_database_is_reported_and_recovers_when_released(tmp_path: Path) -> None:
    db = tmp_path / "activity.db"
    store = _store(db)
    holder = sqlite3.connect(db, isolation_level=None, timeout=0)
    holder.execute("BEGIN EXCLUSIVE")  # another process holds the write lock
    try:
        store.submit(_record(model="while-locked"))
        assert store.flush(timeout=30)
        assert store.problem is not None and "locked" in store.problem
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    store.submit(_record(model="after"))
    assert store.flush(timeout=30)
    assert store.problem is None
    assert [r["model"] for r in store.rows()] == ["after"]  # what came while locked is dropped
    store.close()
