"""The OpenAI Batch API (``/v1/files``, ``/v1/batches``) through a real ``forge serve`` process
and the official ``openai`` client, against the FAKE llama-server (fast; the fake answers chat
completions like the real one, see tests/support/fake_llama_server.py) — one test on the real
llama-server at the end.

Each line goes through the service's own request path: a line for a model its key may not use
is an error line (403), not a failed batch; its rows in the activity log name the key and the
``background`` class. A service stopped in the middle resumes the batch after its restart and
every line is answered exactly once.
"""

from __future__ import annotations

import io
import json
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.support.service import Service, model_section, running_service, wait_for, write_config

ADMIN = "sk-admin-batch"
NIGHT = "sk-night-batch"
OTHER = "sk-other-batch"


def _config(d: Path, model: Path, *, args: list[str], concurrency: int = 4) -> Path:
    keys = (
        f'[[server.keys]]\nname = "night"\nkey = "{NIGHT}"\nmodels = ["m"]\npriority = "batch"\n'
        f'[[server.keys]]\nname = "other"\nkey = "{OTHER}"\n'
    )
    models = model_section("m", model, preload=True, parallel=2, args=args) + model_section(
        "secret", model, args=args
    )
    server = f'[server]\napi_key = "{ADMIN}"\nbatch_concurrency = {concurrency}\n'
    return write_config(d / "forge.toml", server + keys + models)


def _jsonl(lines: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(line) + "\n" for line in lines).encode()


def _chat_line(cid: str, model: str = "m") -> dict[str, Any]:
    return {
        "custom_id": cid,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": model, "messages": [{"role": "user", "content": f"hi {cid}"}], "max_tokens": 4},
    }


def _client(svc: Service, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{svc.url}/v1", api_key=key, timeout=30, max_retries=0)


def _done(client: openai.OpenAI, batch_id: str, timeout: float = 60) -> Any:
    def over() -> Any:
        b = client.batches.retrieve(batch_id)
        return b if b.status in ("completed", "failed", "cancelled", "expired") else None

    return wait_for(over, timeout=timeout, interval=0.1, what=f"batch {batch_id} to end")


def _lines(client: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    text = client.files.content(file_id).text
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_a_batch_end_to_end_with_the_openai_client(tmp_path: Path, fake_bin: Path, tiny_gguf: Path) -> None:
    config = _config(tmp_path, tiny_gguf, args=[])
    with running_service(config, tmp_path / "state", fake_bin, api_key=ADMIN) as svc:
        night = _client(svc, NIGHT)
        lines = [_chat_line(f"req-{i}") for i in range(5)] + [_chat_line("not-mine", model="secret")]
        uploaded = night.files.create(file=("in.jsonl", io.BytesIO(_jsonl(lines))), purpose="batch")
        assert uploaded.purpose == "batch" and uploaded.bytes == len(_jsonl(lines))
        assert night.files.retrieve(uploaded.id).filename == "in.jsonl"
        batch = night.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        assert batch.status == "in_progress" and batch.request_counts is not None
        assert batch.request_counts.total == 6
        done = _done(night, batch.id)
        assert done.status == "completed", done
        assert done.request_counts is not None
        assert (done.request_counts.completed, done.request_counts.failed) == (5, 1)
        out = _lines(night, done.output_file_id)
        assert sorted(line["custom_id"] for line in out) == [f"req-{i}" for i in range(5)]
        for line in out:
            assert line["response"]["status_code"] == 200
            assert line["response"]["body"]["choices"][0]["message"]["role"] == "assistant"
        (err,) = _lines(night, done.error_file_id)
        assert err["custom_id"] == "not-mine" and err["response"]["status_code"] == 403
        assert "may not use model 'secret'" in err["response"]["body"]["error"]["message"]

        # Another key sees neither the batch nor its files; the admin key sees them.
        other = _client(svc, OTHER)
        with pytest.raises(openai.NotFoundError):
            other.batches.retrieve(batch.id)
        with pytest.raises(openai.NotFoundError):
            other.files.content(done.output_file_id)
        assert _client(svc, ADMIN).batches.retrieve(batch.id).id == batch.id
        assert [b.id for b in night.batches.list()] == [batch.id]

        # The lines were the key's requests, in the background class, in the activity log.
        rows = httpx.get(
            f"{svc.url}/api/activity", params={"key": "night", "limit": 50}, headers=svc.headers, timeout=30
        ).json()["activity"]
        batch_rows = [r for r in rows if (r["request_id"] or "").startswith(batch.id)]
        assert len(batch_rows) == 6
        assert {r["priority"] for r in batch_rows} == {"background"}
        assert sorted(r["status"] for r in batch_rows) == [200] * 5 + [403]

        # The store's files are the service's alone.
        store = tmp_path / "state" / "batches"
        assert (store.stat().st_mode & 0o777) == 0o700
        for f in [store / "batches.db", *(store / "files").iterdir()]:
            assert (f.stat().st_mode & 0o777) == 0o600, f


def test_bad_batch_requests_are_clear_4xx(tmp_path: Path, fake_bin: Path, tiny_gguf: Path) -> None:
    config = _config(tmp_path, tiny_gguf, args=[])
    with running_service(config, tmp_path / "state", fake_bin, api_key=ADMIN) as svc:
        night = _client(svc, NIGHT)
        with pytest.raises(openai.BadRequestError, match="purpose 'fine-tune' is not supported"):
            night.files.create(file=("x.jsonl", io.BytesIO(b"{}\n")), purpose="fine-tune")
        f = night.files.create(file=("x.jsonl", io.BytesIO(_jsonl([_chat_line("a")]))), purpose="batch")
        with pytest.raises(openai.BadRequestError, match="endpoint"):
            night.batches.create(input_file_id=f.id, endpoint="/v1/responses", completion_window="24h")
        with pytest.raises(openai.NotFoundError):
            night.batches.create(
                input_file_id="file-nope", endpoint="/v1/chat/completions", completion_window="24h"
            )
        # A line for another endpoint fails the batch at validation, naming the line.
        wrong = {**_chat_line("b"), "url": "/v1/embeddings"}
        f2 = night.files.create(
            file=("y.jsonl", io.BytesIO(_jsonl([_chat_line("a"), wrong]))), purpose="batch"
        )
        b = night.batches.create(
            input_file_id=f2.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        assert b.status == "failed"
        assert b.errors is not None and b.errors.data is not None
        assert b.errors.data[0].line == 2 and "not the batch's endpoint" in (b.errors.data[0].message or "")


def test_a_batch_resumes_after_a_restart_and_answers_each_line_once(
    tmp_path: Path, fake_bin: Path, tiny_gguf: Path
) -> None:
    config = _config(tmp_path, tiny_gguf, args=["--fake-first-token-delay", "0.15"], concurrency=2)
    ids = [f"line-{i}" for i in range(30)]
    with running_service(config, tmp_path / "state", fake_bin, api_key=ADMIN) as svc:
        night = _client(svc, NIGHT)
        f = night.files.create(
            file=("in.jsonl", io.BytesIO(_jsonl([_chat_line(c) for c in ids]))), purpose="batch"
        )
        batch = night.batches.create(
            input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h"
        )

        def some_done() -> bool:
            counts = night.batches.retrieve(batch.id).request_counts
            return counts is not None and counts.completed >= 4

        wait_for(some_done, timeout=60, interval=0.05, what="a few lines answered")
    # Stopped in the middle: the batch is still in progress on disk.
    with running_service(config, tmp_path / "state", fake_bin, api_key=ADMIN) as svc:
        night = _client(svc, NIGHT)
        middle = night.batches.retrieve(batch.id)
        assert middle.request_counts is not None and middle.request_counts.completed < len(ids), middle
        done = _done(night, batch.id, timeout=120)
        assert done.status == "completed", done
        out = _lines(night, done.output_file_id)
        assert sorted(line["custom_id"] for line in out) == sorted(ids)  # each once
        assert done.request_counts is not None and done.request_counts.completed == len(ids)
        assert done.error_file_id is None


def test_a_cancelled_batch_ends_cancelled_with_what_was_done(
    tmp_path: Path, fake_bin: Path, tiny_gguf: Path
) -> None:
    config = _config(tmp_path, tiny_gguf, args=["--fake-first-token-delay", "0.2"], concurrency=1)
    with running_service(config, tmp_path / "state", fake_bin, api_key=ADMIN) as svc:
        night = _client(svc, NIGHT)
        lines = [_chat_line(f"c-{i}") for i in range(50)]
        f = night.files.create(file=("in.jsonl", io.BytesIO(_jsonl(lines))), purpose="batch")
        batch = night.batches.create(
            input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        wait_for(
            lambda: (night.batches.retrieve(batch.id).request_counts or batch.request_counts).completed >= 1,  # type: ignore[union-attr]
            timeout=60,
            what="one line answered",
        )
        assert night.batches.cancel(batch.id).status in ("cancelling", "cancelled")
        done = _done(night, batch.id)
        assert done.status == "cancelled" and done.cancelled_at is not None
        assert done.request_counts is not None and 1 <= done.request_counts.completed < 50
        assert len(_lines(night, done.output_file_id)) == done.request_counts.completed


def test_a_200_line_batch_on_a_real_child_while_an_interactive_client_is_served(
    tmp_path: Path, llama_server_bin: Path, tiny_gguf: Path
) -> None:
    """The real llama-server: 200 lines run in the background class while an interactive client
    sends a request every half second; each interactive request waits at most for one slot to
    free (no longer than the longest batch line took, plus 0.05 s of scheduling), not for the six
    batch lines queued before it."""
    # 8 lines at a time for 2 slots: with FIFO an interactive request would wait behind 6.
    config = _config(tmp_path, tiny_gguf, args=["--threads", "1"], concurrency=8)
    ids = [f"real-{i}" for i in range(200)]
    long = {"max_tokens": 256, "ignore_eos": True}
    lines = [{**_chat_line(c), "body": {**_chat_line(c)["body"], **long}} for c in ids]
    with running_service(config, tmp_path / "state", llama_server_bin, api_key=ADMIN) as svc:
        night = _client(svc, NIGHT)
        f = night.files.create(file=("in.jsonl", io.BytesIO(_jsonl(lines))), purpose="batch")
        batch = night.batches.create(
            input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        admin = _client(svc, ADMIN)
        sent: list[str] = []
        while night.batches.retrieve(batch.id).status == "in_progress" and len(sent) < 60:
            rid = f"interactive-{len(sent)}"
            r = admin.chat.completions.create(
                model="m",
                messages=[{"role": "user", "content": "hi"}],
                max_tokens=8,
                extra_headers={"X-Request-ID": rid},
            )
            assert r.choices[0].message is not None
            sent.append(rid)
            time.sleep(0.5)  # the client's pace, not a wait for a condition
        done = _done(night, batch.id, timeout=300)
        assert done.status == "completed", done
        out = _lines(night, done.output_file_id)
        assert sorted(line["custom_id"] for line in out) == sorted(ids)
        assert all(line["response"]["status_code"] == 200 for line in out)
        assert len(sent) >= 2, "the batch ended before the interactive client could send twice"

        def rows() -> list[dict[str, Any]]:
            r = httpx.get(f"{svc.url}/api/activity", params={"limit": 1000}, headers=svc.headers, timeout=30)
            return list(r.json()["activity"])

        every = wait_for(lambda: (rs := rows()) and len(rs) >= len(ids) + len(sent) and rs, timeout=30)
        inter = [r for r in every if r["request_id"] in sent]
        lines_run = [r for r in every if (r["request_id"] or "").startswith(batch.id)]
        assert {r["priority"] for r in inter} == {"interactive"}
        assert {r["priority"] for r in lines_run} == {"background"}
        longest_line = max(r["duration"] - r["queue_wait"] for r in lines_run)
        worst_wait = max(r["queue_wait"] for r in inter)
        assert worst_wait <= longest_line + 0.05, (worst_wait, longest_line)


def test_files_and_batches_list_in_pages_as_the_openai_client_reads_them(
    tmp_path: Path, fake_bin: Path, tiny_gguf: Path
) -> None:
    config = _config(tmp_path, tiny_gguf, args=[])
    with running_service(config, tmp_path / "state", fake_bin, api_key=ADMIN) as svc:
        night = _client(svc, NIGHT)
        made = [
            night.files.create(
                file=(f"{i}.jsonl", io.BytesIO(_jsonl([_chat_line(str(i))]))), purpose="batch"
            ).id
            for i in range(5)
        ]
        first = night.files.list(limit=2)
        assert [f.id for f in first.data] == made[::-1][:2] and first.has_more
        # The client follows ``after`` page by page: every file once, newest first.
        assert [f.id for f in night.files.list(limit=2)] == made[::-1]
        assert [f.id for f in night.files.list(limit=2, order="asc")] == made
        for params in ({"limit": "0"}, {"limit": "x"}, {"order": "up"}):
            r = httpx.get(f"{svc.url}/v1/files", params=params, headers={"Authorization": f"Bearer {NIGHT}"})
            assert r.status_code == 400 and r.json()["error"]["param"] in ("limit", "order"), r.text
        batches = [
            night.batches.create(input_file_id=f, endpoint="/v1/chat/completions", completion_window="24h").id
            for f in made[:3]
        ]
        assert [b.id for b in night.batches.list(limit=1)] == batches[::-1]
