"""Who used what, through `forge serve` on the real llama-server, spoken by the real SDKs.

One service (module-scoped) with an admin ``api_key`` and three ``[[server.keys]]``: ``scoped``
(model ``chat`` only), ``limited`` (2 requests per minute) and ``meter`` (used by one test alone,
so its usage sums are exact). Capture is off there; the capture test runs its own service, and
restarts it on the same state dir to see the rows survive, then once more on a corrupt file.
"""

from __future__ import annotations

import json
import os
import select
import sqlite3
import subprocess
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import anthropic
import httpx
import ollama
import openai
import pytest

from tests.support.service import (
    FORGE,
    Service,
    chat_and_plain_models,
    model_section,
    running_service,
    wait_for,
    write_config,
)

ADMIN = "sk-admin-activity"
SCOPED = "sk-scoped-activity"
LIMITED = "sk-limited-activity"
METER = "sk-meter-activity"
KEYS = f"""
[[server.keys]]
name = "scoped"
key = "{SCOPED}"
models = ["chat"]
[[server.keys]]
name = "limited"
key = "{LIMITED}"
requests_per_minute = 2
[[server.keys]]
name = "meter"
key = "{METER}"
"""
HELLO = [{"role": "user", "content": "Hello"}]


@pytest.fixture(scope="module")
def svc(
    tmp_path_factory: pytest.TempPathFactory, llama_server_bin: Path, smollm2_path: Path
) -> Iterator[Service]:
    d = tmp_path_factory.mktemp("activity")
    # ``real``: the real SmolLM2 (~100 tokens/s here), for the request a client leaves mid-stream:
    # the tiny models write 900 tokens in under half a second, before the client's close is seen.
    real = model_section("real", smollm2_path, parallel=1, preload=True)
    config = write_config(
        d / "forge.toml", f'[server]\napi_key = "{ADMIN}"\n' + KEYS + chat_and_plain_models(d) + real
    )
    with running_service(config, d / "state", llama_server_bin, api_key=ADMIN) as s:
        yield s


def _http(svc: Service, key: str | None = None) -> httpx.Client:
    """A client with ``key``, else the service's admin key."""
    headers = {"Authorization": f"Bearer {key or svc.api_key}"}
    return httpx.Client(base_url=svc.url, headers=headers, timeout=60)


def _rows(svc: Service, **params: Any) -> list[dict[str, Any]]:
    with _http(svc) as c:
        r = c.get("/api/activity", params={"limit": 1000, **params})
    assert r.status_code == 200, r.text
    rows: list[dict[str, Any]] = r.json()["activity"]
    return rows


def _row_of(svc: Service, request_id: str) -> dict[str, Any]:
    """The row of the request sent with this X-Request-ID, once written (polled)."""

    def find() -> dict[str, Any] | None:
        return next((r for r in _rows(svc) if r["request_id"] == request_id), None)

    row: dict[str, Any] = wait_for(find, timeout=30, what=f"the activity row of {request_id}")
    return row


def _openai(svc: Service, key: str, closing: ExitStack) -> openai.OpenAI:
    return closing.enter_context(openai.OpenAI(base_url=f"{svc.url}/v1", api_key=key, max_retries=0))


def test_a_scoped_key_gets_its_model_and_a_403_naming_it_for_another_in_each_dialect(
    svc: Service, closing: ExitStack
) -> None:
    oa = _openai(svc, SCOPED, closing)
    assert oa.chat.completions.create(model="chat", messages=HELLO, max_tokens=2).choices  # type: ignore[arg-type]
    with pytest.raises(openai.PermissionDeniedError) as no_oa:
        oa.chat.completions.create(model="plain", messages=HELLO, max_tokens=2)  # type: ignore[arg-type]
    body: Any = no_oa.value.body
    assert body["code"] == "model_not_allowed"
    assert "'scoped'" in body["message"] and "'plain'" in body["message"] and SCOPED not in body["message"]

    an = closing.enter_context(anthropic.Anthropic(base_url=svc.url, api_key=SCOPED, max_retries=0))
    assert an.messages.create(model="chat", max_tokens=2, messages=HELLO).content  # type: ignore[arg-type]
    with pytest.raises(anthropic.PermissionDeniedError) as no_an:
        an.messages.create(model="plain", max_tokens=2, messages=HELLO)  # type: ignore[arg-type]
    an_body: Any = no_an.value.body
    assert an_body["type"] == "error" and an_body["error"]["type"] == "permission_error"
    assert "'scoped'" in an_body["error"]["message"] and "'plain'" in an_body["error"]["message"]

    ol = closing.enter_context(ollama.Client(host=svc.url, headers={"Authorization": f"Bearer {SCOPED}"}))
    assert ol.chat(model="chat", messages=HELLO, options={"num_predict": 2}).message is not None
    with pytest.raises(ollama.ResponseError) as no_ol:
        ol.chat(model="plain", messages=HELLO, options={"num_predict": 2})
    assert (
        no_ol.value.status_code == 403 and "'scoped'" in no_ol.value.error and SCOPED not in no_ol.value.error
    )

    with _http(svc, SCOPED) as c:  # control routes need an admin key
        load = c.post("/api/models/chat/load")
        reload = c.post("/api/reload")
    assert load.status_code == 403 and load.json()["error"]["code"] == "admin_required"
    assert reload.status_code == 403
    refused = [r for r in _rows(svc, key="scoped") if r["status"] == 403]
    assert {r["model"] for r in refused} == {"plain"} and len(refused) == 3  # one per dialect


def test_the_third_request_in_a_minute_is_a_429_with_retry_after(svc: Service, closing: ExitStack) -> None:
    oa = _openai(svc, LIMITED, closing)
    for _ in range(2):
        oa.chat.completions.create(model="chat", messages=HELLO, max_tokens=1)  # type: ignore[arg-type]
    with pytest.raises(openai.RateLimitError) as over:
        oa.chat.completions.create(model="chat", messages=HELLO, max_tokens=1)  # type: ignore[arg-type]
    assert 1 <= int(over.value.response.headers["retry-after"]) <= 60
    assert "'limited'" in over.value.message and "2 requests per minute" in over.value.message
    with _http(svc, LIMITED) as c:  # the Ollama and Anthropic routes share the key's minute
        assert c.post("/api/chat", json={"model": "chat", "messages": HELLO}).status_code == 429
        anth = c.post("/v1/messages", json={"model": "chat", "max_tokens": 1, "messages": HELLO})
    assert anth.status_code == 429 and anth.json()["error"]["type"] == "rate_limit_error"


def test_usage_sums_equal_the_responses_usage(svc: Service, closing: ExitStack) -> None:
    prompt = completion = 0
    oa = _openai(svc, METER, closing)
    r = oa.chat.completions.create(model="chat", messages=HELLO, max_tokens=3)  # type: ignore[arg-type]
    assert r.usage is not None
    prompt, completion = prompt + r.usage.prompt_tokens, completion + r.usage.completion_tokens
    chunks = list(
        oa.chat.completions.create(
            model="chat",
            messages=HELLO,  # type: ignore[arg-type]
            max_tokens=4,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    usage = chunks[-1].usage
    assert usage is not None
    prompt, completion = prompt + usage.prompt_tokens, completion + usage.completion_tokens
    an = closing.enter_context(anthropic.Anthropic(base_url=svc.url, api_key=METER, max_retries=0))
    with an.messages.stream(model="chat", max_tokens=3, messages=HELLO) as stream:  # type: ignore[arg-type]
        final = stream.get_final_message()
    # Anthropic's input_tokens leave out the prompt read from the cache; a charge counts it all.
    anthropic_prompt = final.usage.input_tokens + (final.usage.cache_read_input_tokens or 0)
    prompt, completion = prompt + anthropic_prompt, completion + final.usage.output_tokens
    ol = closing.enter_context(ollama.Client(host=svc.url, headers={"Authorization": f"Bearer {METER}"}))
    reply = ol.chat(model="plain", messages=HELLO, options={"num_predict": 2})
    prompt, completion = prompt + (reply.prompt_eval_count or 0), completion + (reply.eval_count or 0)
    assert prompt > 0 and completion > 0

    def meter() -> dict[str, Any] | None:
        with _http(svc) as c:
            rows = c.get("/api/usage", params={"by": "key", "since": "1h"}).json()["usage"]
        row = next((r for r in rows if r["key"] == "meter"), None)
        return row if row is not None and row["requests"] == 4 else None

    row = wait_for(meter, timeout=30, what="meter's 4 requests in /api/usage")
    assert (row["prompt_tokens"], row["completion_tokens"]) == (prompt, completion)
    assert row["total_tokens"] == prompt + completion and row["errors"] == 0
    rows = _rows(svc, key="meter")  # every dialect's row has its queue wait and its finish reason
    assert {r["route"] for r in rows} == {"/v1/chat/completions", "/v1/messages", "/api/chat"}
    assert all(r["queue_wait"] is not None and r["finish_reason"] for r in rows), rows

    with _http(svc, METER) as c:  # a key that is not an admin sees its own usage only
        own = c.get("/api/usage").json()["usage"]
        by_model = c.get("/api/usage", params={"by": "model"})
        bad = c.get("/api/usage", params={"since": "yesterday-ish"})
    assert [r["key"] for r in own] == ["meter"]
    assert by_model.status_code == 403
    assert bad.status_code == 400 and "since" in bad.json()["error"]["message"]

    cli = _forge(svc, "usage", "--json")
    assert cli.returncode == 0, cli.stderr
    printed = {r["key"]: r for r in json.loads(cli.stdout)["usage"]}
    assert printed["meter"]["total_tokens"] == prompt + completion
    with _http(svc) as c:
        metrics = c.get("/metrics").text
    assert 'forge_key_requests_total{key="meter",model="chat",status="200"} 3.0' in metrics
    expected = (
        f'forge_key_tokens_total{{key="meter",kind="prompt",model="plain"}} {reply.prompt_eval_count}.0'
    )
    assert expected in metrics, [ln for ln in metrics.splitlines() if ln.startswith("forge_key_tokens")]


def test_activity_rows_of_a_streamed_a_plain_a_cancelled_and_a_failed_request(svc: Service) -> None:
    with _http(svc) as c:
        stream_usage: dict[str, Any] = {}
        with c.stream(
            "POST",
            "/v1/chat/completions",
            headers={"X-Request-ID": "act-stream"},
            json={
                "model": "chat",
                "messages": HELLO,
                "max_tokens": 5,
                "stream": True,
                "stream_options": {"include_usage": True},
            },
        ) as s:
            for line in s.iter_lines():
                if line.startswith("data: {") and '"usage"' in line:
                    stream_usage = json.loads(line[6:]).get("usage") or stream_usage
        plain = c.post(
            "/v1/chat/completions",
            headers={"X-Request-ID": "act-plain"},
            json={"model": "chat", "messages": HELLO, "max_tokens": 3},
        ).json()["usage"]
        failed = c.post(
            "/v1/chat/completions",
            headers={"X-Request-ID": "act-failed"},
            json={"model": "chat", "messages": HELLO, "temperature": "hot"},
        )
        with c.stream(
            "POST",
            "/v1/chat/completions",
            headers={"X-Request-ID": "act-cancelled"},
            json={"model": "real", "messages": HELLO, "max_tokens": 900, "ignore_eos": True, "stream": True},
        ) as s:
            for line in s.iter_lines():  # the first token came: the client leaves
                if '"content":"' in line and '"content":""' not in line:
                    break
    assert failed.status_code == 400 and stream_usage

    streamed = _row_of(svc, "act-stream")
    assert streamed["stream"] and streamed["status"] == 200 and not streamed["cancelled"]
    assert (streamed["prompt_tokens"], streamed["completion_tokens"]) == (
        stream_usage["prompt_tokens"],
        stream_usage["completion_tokens"],
    )
    assert streamed["finish_reason"] == "length" and streamed["key"] == "api_key"
    assert streamed["ttft"] is not None and streamed["queue_wait"] is not None
    assert 0 < streamed["ttft"] <= streamed["duration"] and streamed["client"] == "127.0.0.1"

    row = _row_of(svc, "act-plain")
    assert not row["stream"] and row["status"] == 200 and row["model"] == "chat"
    assert (row["prompt_tokens"], row["completion_tokens"]) == (
        plain["prompt_tokens"],
        plain["completion_tokens"],
    )
    assert row["tokens_per_second"] > 0

    bad = _row_of(svc, "act-failed")
    assert bad["status"] == 400 and bad["error"] and bad["completion_tokens"] is None

    cancelled = _row_of(svc, "act-cancelled")
    assert cancelled["cancelled"] and cancelled["stream"] and cancelled["status"] == 200
    # The usage never came: charged what was relayed before the client left (at least its token).
    assert cancelled["completion_tokens"] is not None and 1 <= cancelled["completion_tokens"] < 900

    listed = _rows(svc, model="chat", status=400)
    assert listed and all(r["status"] == 400 and r["model"] == "chat" for r in listed)
    assert "request_body" not in listed[0]  # a listing has no bodies
    table = _forge(svc, "activity", "--limit", "5")
    assert table.returncode == 0 and "act" not in table.stderr and "/v1/chat/completions" in table.stdout
    as_json = _forge(svc, "activity", "--json", "--status", "400")
    assert {r["status"] for r in json.loads(as_json.stdout)["activity"]} == {400}


def test_with_capture_off_the_database_holds_no_prompt_text(svc: Service, closing: ExitStack) -> None:
    marker = "zebra-marmalade-capture-off"
    oa = _openai(svc, ADMIN, closing)
    oa.chat.completions.create(
        model="chat",
        messages=[{"role": "user", "content": marker}],
        max_tokens=2,
        extra_headers={"X-Request-ID": "act-nocapture"},
    )
    row = _row_of(svc, "act-nocapture")
    assert not row["captured"]
    assert marker not in _database_text(svc.state_dir / "activity.db")
    with _http(svc) as c:
        assert c.get(f"/api/activity/{row['id']}").json()["request_body"] is None


def test_forge_activity_follow_prints_each_new_request(svc: Service) -> None:
    with _http(svc) as c:
        c.post("/tokenize", json={"model": "chat", "content": "a"}, headers={"X-Request-ID": "follow-1"})
    _row_of(svc, "follow-1")
    env = dict(os.environ, FORGE_STATE_DIR=str(svc.state_dir), NO_COLOR="1")
    argv = [*FORGE, "activity", "--follow", "--json", "--limit", "1", "--config", str(svc.config)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert json.loads(_line(proc))["request_id"] == "follow-1"
        with _http(svc) as c:
            c.post("/tokenize", json={"model": "chat", "content": "b"}, headers={"X-Request-ID": "follow-2"})
        assert json.loads(_line(proc))["request_id"] == "follow-2"
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


def _line(proc: subprocess.Popen[str], timeout: float = 30) -> str:
    """The next stdout line of ``proc``, waited for at most ``timeout`` seconds."""
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, f"no line from forge activity --follow within {timeout} s"
    return proc.stdout.readline()


def _database_text(db: Path) -> str:
    """Every value of every row, read with sqlite3, and the raw bytes of the file and its WAL."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        values = [str(v) for row in conn.execute("SELECT * FROM requests") for v in row]
    finally:
        conn.close()
    raw = b"".join(p.read_bytes() for p in db.parent.glob(db.name + "*"))
    return "\n".join(values) + raw.decode("latin-1")


def _forge(svc: Service, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, FORGE_STATE_DIR=str(svc.state_dir), COLUMNS="200", NO_COLOR="1")
    env.pop("FORGE_API_KEY", None)
    return subprocess.run(
        [*FORGE, *args, "--config", str(svc.config)], capture_output=True, text=True, env=env, timeout=60
    )


def test_capture_keeps_prompt_and_reply_never_a_key_and_rows_survive_a_restart(
    tmp_path: Path, llama_server_bin: Path, closing: ExitStack
) -> None:
    admin, reader = "sk-admin-capture", "sk-reader-capture"
    marker = "quokka-tangerine-capture-on"
    models = chat_and_plain_models(tmp_path).replace("[models.plain]\n", "[models.plain]\ncapture = false\n")
    config = write_config(
        tmp_path / "forge.toml",
        f'[server]\napi_key = "{admin}"\ncapture = true\n'
        f'[[server.keys]]\nname = "reader"\nkey = "{reader}"\n'
        '[[server.keys]]\nname = "daily"\nkey = "sk-daily"\ntokens_per_day = 1\n' + models,
    )
    daily = {"model": "chat", "messages": HELLO, "max_tokens": 1}
    state = tmp_path / "state"
    db = state / "activity.db"
    with running_service(config, state, llama_server_bin, api_key=admin) as svc:
        oa = closing.enter_context(openai.OpenAI(base_url=f"{svc.url}/v1", api_key=reader, max_retries=0))
        # A client that pastes its own key into a prompt: the key's bytes still never reach the file.
        reply = oa.chat.completions.create(
            model="chat",
            messages=[{"role": "user", "content": f"{marker} my key is {reader}"}],
            max_tokens=4,
            extra_headers={"X-Request-ID": "cap-plain"},
        )
        pieces = [
            c.choices[0].delta.content or ""
            for c in oa.chat.completions.create(
                model="chat",
                messages=[{"role": "user", "content": marker}],
                max_tokens=4,
                stream=True,
                extra_headers={"X-Request-ID": "cap-stream"},
            )
            if c.choices
        ]
        with _http(svc, admin) as c:  # a model whose own capture = false wins over [server]'s
            r = c.post(
                "/tokenize", json={"model": "plain", "content": marker}, headers={"X-Request-ID": "cap-off"}
            )
            assert r.status_code == 200
        with _http(svc, "sk-daily") as c:  # the first request of the day fits, the next is over it
            assert c.post("/v1/chat/completions", json=daily).status_code == 200
            wait_for(
                lambda: c.post("/v1/chat/completions", json=daily).status_code == 429, what="the day's limit"
            )
        plain_id = _row_of(svc, "cap-plain")["id"]
        assert not _row_of(svc, "cap-off")["captured"]
        stream_id = _row_of(svc, "cap-stream")["id"]
        with _http(svc, admin) as c:
            plain_row = c.get(f"/api/activity/{plain_id}").json()
            stream_row = c.get(f"/api/activity/{stream_id}").json()
        with _http(svc, reader) as c:
            refused = c.get(f"/api/activity/{plain_id}")
            own = c.get("/api/activity").json()["activity"]
        text = _database_text(db)
    assert marker in plain_row["request_body"] and reader not in plain_row["request_body"]
    assert reply.choices[0].message.content in plain_row["response_body"]
    assert stream_row["response_body"].startswith("".join(pieces))  # the stream, as its text
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "admin_required"
    assert {r["key"] for r in own} == {"reader"}
    assert marker in text and reader not in text and admin not in text

    with running_service(config, state, llama_server_bin, api_key=admin) as svc:
        ids = {r["id"] for r in _rows(svc)}
        assert {plain_id, stream_id} <= ids
        with _http(svc, "sk-daily") as c:  # the day's tokens came back from the log
            again = c.post("/v1/chat/completions", json=daily)
        assert again.status_code == 429 and int(again.headers["retry-after"]) > 3600
        assert "'daily'" in again.json()["error"]["message"]
        # A reload applies the keys from the next request on: one re-scoped, one added.
        config.write_text(
            config.read_text().replace(
                f'key = "{reader}"',
                f'key = "{reader}"\nmodels = ["plain"]\n[[server.keys]]\nname = "late"\nkey = "sk-late"',
            )
        )
        with _http(svc, admin) as c:
            assert c.post("/api/reload").status_code == 200
        body = {"model": "chat", "messages": HELLO, "max_tokens": 1}
        with _http(svc, reader) as c:
            rescoped = c.post("/v1/chat/completions", json=body)
        with _http(svc, "sk-late") as c:
            late = c.post("/v1/chat/completions", json=body)
    assert rescoped.status_code == 403 and rescoped.json()["error"]["code"] == "model_not_allowed"
    assert late.status_code == 200

    for p in state.glob("activity.db*"):
        p.unlink()
    db.write_bytes(b"not a database at all " * 64)
    with running_service(config, state, llama_server_bin, api_key=admin) as svc, _http(svc, admin) as c:
        ready = c.get("/ready")
        served = c.post("/v1/chat/completions", json={"model": "chat", "messages": HELLO, "max_tokens": 1})
        listing = c.get("/api/activity")
        assert "activity log" in svc.stderr_text() and "forge doctor" in svc.stderr_text()
    assert ready.status_code == 200 and "unavailable" in ready.json()["activity"]
    assert served.status_code == 200
    assert listing.status_code == 503 and "forge doctor" in listing.json()["error"]["message"]
