"""The Batch API's store: what fails a batch's input at validation, and each line answered once."""

from __future__ import annotations

import json
from pathlib import Path

from rocmforge_supervisor.batches import BatchStore, parse_input

EP = "/v1/chat/completions"


def _line(cid: str, **over: object) -> bytes:
    line = {"custom_id": cid, "method": "POST", "url": EP, "body": {"model": "m"}, **over}
    return json.dumps(line).encode()


def test_a_good_file_gives_its_lines_in_order() -> None:
    lines, errors = parse_input(b"\n".join([_line("a"), b"", _line("b")]), EP, 10)
    assert errors == []
    assert [(ln.idx, ln.custom_id) for ln in lines] == [(0, "a"), (1, "b")]


def test_each_bad_line_is_named_by_its_number() -> None:
    data = b"\n".join(
        [
            _line("a"),
            b"{not json",
            _line("a"),
            _line("c", url="/v1/embeddings"),
            _line("d", method="GET"),
            b"[]",
        ]
    )
    _, errors = parse_input(data, EP, 10)
    assert [(e["line"], e["message"].split(":")[0].split(" (")[0]) for e in errors] == [
        (2, "not JSON"),
        (3, "custom_id 'a' is used twice"),
        (4, "url '/v1/embeddings' is not the batch's endpoint '/v1/chat/completions'"),
        (5, "method must be POST, not 'GET'"),
        (6, "a line must be a JSON object with custom_id, method, url and body"),
    ]


def test_too_many_lines_and_an_empty_file_fail() -> None:
    _, errors = parse_input(b"\n".join(_line(str(i)) for i in range(3)), EP, 2)
    assert errors[-1]["code"] == "too_many_requests" and "server.batch_max_lines" in errors[-1]["message"]
    _, errors = parse_input(b"\n\n", EP, 2)
    assert errors[0]["code"] == "empty_file"


def test_a_line_is_answered_once_and_the_files_keep_input_order(tmp_path: Path) -> None:
    store = BatchStore(tmp_path / "batches")
    lines, _ = parse_input(b"\n".join(_line(c) for c in "abc"), EP, 10)
    f = store.add_file(b"x", filename="in.jsonl", purpose="batch", owner="k")
    b = store.create_batch(
        owner="k", input_file_id=f["id"], endpoint=EP, window="24h", metadata=None, lines=lines, errors=[]
    )
    store.answer(b["id"], 2, ok=True, result={"custom_id": "c"})
    store.answer(b["id"], 0, ok=False, result={"custom_id": "a"})
    counts = store.answer(b["id"], 2, ok=False, result={"custom_id": "c-again"})  # ignored
    assert counts == {"total": 3, "completed": 1, "failed": 1}
    assert [ln.custom_id for ln in store.pending(b["id"], 10)] == ["b"]
    store.answer(b["id"], 1, ok=True, result={"custom_id": "b"})
    done = store.finish(b, "completed", "k")
    out = store.content(done["output_file_id"]).decode().splitlines()
    assert [json.loads(x)["custom_id"] for x in out] == ["b", "c"]
    assert [
        json.loads(x)["custom_id"] for x in store.content(done["error_file_id"]).decode().splitlines()
    ] == ["a"]
    assert done["status"] == "completed" and done["completed_at"] is not None
    store.close()
