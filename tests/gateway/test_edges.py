"""The gateway's edges against a real `forge serve`: hostile bodies, llama-server's own errors as
4xx with a hint, JSON for every error in the shape of its API, and the model-config keys that
change what reaches the child (max_tokens default, embeddings, queue = 0)."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.support.service import FAST, Service, model_section, running_service, wait_for, write_config


@pytest.fixture(scope="module")
def svc(
    tmp_path_factory: pytest.TempPathFactory, tiny_gguf: Path, gemma_path: Path, llama_server_bin: Path
) -> Iterator[Service]:
    """One service for the read-only checks (every model preloaded: a child started by one test
    would look like another test's orphan): `tiny` (ctx 1024 over 4 slots, max_tokens default 3),
    `emb` (embeddings = true), `noemb` (a second copy without it) and `base` (gemma-3-270m: a base
    model without a chat template, which forge runs with --no-jinja and a built-in template)."""
    tmp = tmp_path_factory.mktemp("edges")
    emb = tmp / "emb.gguf"
    shutil.copy(tiny_gguf, emb)
    cfg = write_config(
        tmp / "forge.toml",
        FAST
        + model_section("tiny", tiny_gguf, preload=True, parallel=4, max_tokens=3)
        + model_section("emb", emb, embeddings=True, parallel=1, preload=True)
        + model_section("noemb", emb, parallel=1, preload=True)
        + model_section("base", gemma_path, parallel=1, preload=True),
    )
    with running_service(cfg, tmp / "state", llama_server_bin) as s:
        yield s


MSG = [{"role": "user", "content": "Hi"}]


def _chat(**kw: Any) -> dict[str, Any]:
    return {"model": "tiny", "messages": MSG, "max_tokens": 2, **kw}


DEEP = (
    '{"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "x": ' + "[" * 5000 + "]" * 5000 + "}"
)

# (path, body: a dict is sent as JSON, a str as is; the field the error must name, or a word of it)
HOSTILE: list[tuple[str, object, str]] = [
    ("/v1/chat/completions", DEEP, "nested too deeply"),
    ("/v1/chat/completions", _chat(max_tokens=2**70), "max_tokens"),
    ("/v1/chat/completions", _chat(seed=2**70), "seed"),
    ("/v1/chat/completions", _chat(max_tokens="many"), "max_tokens"),
    ("/v1/chat/completions", _chat(max_tokens=True), "max_tokens"),
    ("/v1/chat/completions", _chat(temperature="hot"), "temperature"),
    ("/v1/chat/completions", _chat(stream="yes"), "stream"),
    ("/v1/chat/completions", _chat(stop=[1]), "stop[0]"),
    ("/v1/chat/completions", _chat(messages=[{"content": "Hi"}]), "messages[0].role"),
    ("/v1/chat/completions", _chat(messages=[{"role": 5, "content": "Hi"}]), "messages[0].role"),
    ("/v1/chat/completions", _chat(messages="Hi"), "messages"),
    ("/v1/chat/completions", _chat(messages=["Hi"]), "messages[0]"),
    ("/v1/chat/completions", _chat(messages=[{"role": "user", "content": [5]}]), "messages[0].content[0]"),
    ("/v1/chat/completions", '{"model": "tiny", "messages": [], "temperature": 1e400}', "out of range"),
    ("/v1/chat/completions", '{"model": "tiny", "messages": [], "temperature": NaN}', "NaN"),
    ("/v1/chat/completions", "[1, 2]", "JSON object"),
    ("/v1/chat/completions", '{"model": "tiny", ', "not valid JSON"),
    ("/v1/chat/completions", b'{"model": "ti\xffny"}'.decode("latin-1"), "not valid JSON"),
    ("/v1/chat/completions", {"model": 5, "messages": MSG}, "model"),
    ("/v1/completions", {"model": "tiny", "prompt": {"a": 1}}, "prompt"),
    ("/v1/embeddings", {"model": "emb", "input": 5}, "input"),
    ("/api/models", '{"name": ' + "[" * 3000 + "]" * 3000 + "}", "nested too deeply"),
    ("/api/models", {"name": ["x"], "path": "/x.gguf"}, "name"),
]


@pytest.mark.parametrize(("path", "body", "names"), HOSTILE, ids=[f"{p}:{n}" for p, _, n in HOSTILE])
def test_hostile_body_is_a_400_naming_the_field(svc: Service, path: str, body: object, names: str) -> None:
    content = body.encode("latin-1") if isinstance(body, str) else json.dumps(body).encode()
    with svc.client() as c:
        r = c.post(path, content=content, headers={"Content-Type": "application/json"})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert names in err["message"] or names == err["param"], err
    assert svc.proc.poll() is None


def test_service_still_answers_after_the_hostile_table(svc: Service) -> None:
    with svc.client() as c:
        r = c.post("/v1/chat/completions", json=_chat())
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2


@pytest.mark.parametrize(
    ("method", "path", "status", "allow"),
    [
        ("GET", "/v1/nope", 404, None),
        ("GET", "/v1/chat/completions", 405, "POST"),
        ("DELETE", "/v1/models", 405, "GET"),
        ("GET", "/api/nope", 404, None),
        ("PUT", "/api/models/tiny/load", 405, "POST"),
        ("GET", "/nope", 404, None),
    ],
)
def test_every_error_is_json_in_the_apis_shape(
    svc: Service, method: str, path: str, status: int, allow: str | None
) -> None:
    with svc.client() as c:
        r = c.request(method, path)
    assert r.status_code == status
    assert r.headers["content-type"] == "application/json"
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert path in err["message"]
    if allow:
        assert allow in r.headers["allow"]


# A form's JSON (text/plain sends name=value unencoded): what a cross-site page could post.
FORM_JSON = b'{"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "x": "="}'
# One JSON route of each dialect; the control API's names a model that does not exist, so a
# request that got through would be a 404, never an unload.
JSON_ROUTES = [
    ("/v1/chat/completions", "openai"),
    ("/v1/messages", "anthropic"),
    ("/api/generate", "ollama"),
    ("/api/models/nosuch/unload", "openai"),
]
NOT_JSON = [
    ("text/plain", FORM_JSON),
    ("text/plain;charset=UTF-8", FORM_JSON),
    (
        "multipart/form-data; boundary=x",
        b"--x\r\nContent-Disposition: form-data; name=a\r\n\r\nb\r\n--x--\r\n",
    ),
    ("application/x-www-form-urlencoded", b"model=tiny&prompt=Hi"),  # what an HTML form sends
    ("application/x-www-form-urlencoded", b""),
    ("application/xml", b"<model>tiny</model>"),
]


@pytest.mark.parametrize(("path", "dialect"), JSON_ROUTES)
@pytest.mark.parametrize(("ctype", "body"), NOT_JSON, ids=[f"{c}:{len(b)}" for c, b in NOT_JSON])
def test_a_body_that_is_not_json_is_a_415(
    svc: Service, path: str, dialect: str, ctype: str, body: bytes
) -> None:
    with svc.client() as c:
        r = c.post(path, content=body, headers={"Content-Type": ctype})
    assert r.status_code == 415, r.text
    data = r.json()
    if dialect == "anthropic":
        assert data["type"] == "error" and data["error"]["type"] == "invalid_request_error"
        message = data["error"]["message"]
    elif dialect == "ollama":
        message = data["error"]
    else:
        assert data["error"]["code"] == "unsupported_media_type"
        message = data["error"]["message"]
    assert "\n" not in message and f"POST {path} takes a JSON body" in message, message
    assert "Content-Type: application/json" in message, message
    assert ctype.split(";")[0] in message or "form-encoded" in message, message


@pytest.mark.parametrize(
    "headers",
    [
        {"Content-Type": "application/json"},
        {"Content-Type": "Application/JSON; charset=utf-8"},
        {"Content-Type": "application/vnd.forge+json"},
        {},  # no Content-Type: no HTML form sends that
        {"Content-Type": "application/x-www-form-urlencoded"},  # curl -d's label, a JSON body
    ],
    ids=["json", "json-charset", "plus-json", "none", "curl-default"],
)
def test_json_bodies_are_served(svc: Service, headers: dict[str, str]) -> None:
    content = b"\n  " + json.dumps(_chat()).encode()
    with svc.client() as c:
        r = c.post("/v1/chat/completions", content=content, headers=headers)
        assert r.status_code == 200, r.text
        # the same, chunked: the first bytes (blank) and the JSON arrive in separate messages
        chunked = c.post(
            "/v1/chat/completions", content=iter([b"\n  ", json.dumps(_chat()).encode()]), headers=headers
        )
        assert chunked.status_code == 200, chunked.text
    assert chunked.json()["usage"]["completion_tokens"] == 2


def test_curl_as_the_docs_write_it(svc: Service) -> None:
    """``curl -d`` without a Content-Type (Ollama's docs) and with ``-H 'Content-Type: application/json'``
    (OpenAI's) are served; a form body from curl (``-F``) is a 415."""
    curl = shutil.which("curl")
    assert curl, "curl is needed for this test"

    def run(*args: str) -> tuple[int, dict[str, Any]]:
        out = subprocess.run(
            [curl, "-s", "-w", "\n%{http_code}", *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
        body, _, code = out.rpartition("\n")
        return int(code), json.loads(body)

    generate = json.dumps({"model": "tiny", "prompt": "Hi", "stream": False, "options": {"num_predict": 2}})
    code, data = run(f"{svc.url}/api/generate", "-d", generate)
    assert code == 200 and data["done"] is True, data
    code, data = run(
        f"{svc.url}/v1/chat/completions", "-H", "Content-Type: application/json", "-d", json.dumps(_chat())
    )
    assert code == 200 and data["usage"]["completion_tokens"] == 2, data
    code, data = run(f"{svc.url}/v1/chat/completions", "-F", "model=tiny")
    assert code == 415 and "multipart/form-data" in data["error"]["message"], data


def test_retrieve_model_with_the_openai_sdk(svc: Service) -> None:
    client = openai.OpenAI(base_url=f"{svc.url}/v1", api_key="unused", max_retries=0)
    m = client.models.retrieve("tiny")
    assert (m.id, m.object) == ("tiny", "model")
    with pytest.raises(openai.NotFoundError, match="nope"):
        client.models.retrieve("nope")


def test_tools_on_a_template_less_model_is_a_400_with_a_hint(svc: Service) -> None:
    """gemma-3-270m has no chat template: forge runs it with --no-jinja, and llama-server answers
    tools with a 500 ("tools param requires --jinja flag") that SDKs would retry 3 times."""
    client = openai.OpenAI(base_url=f"{svc.url}/v1", api_key="unused", max_retries=0)
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="base", messages=MSG, max_tokens=2, tools=[tool])  # type: ignore[list-item]
    message = str(info.value)
    # Refused by the gateway's one tools check (service/proxy/_tools.py), before the child is asked.
    assert "'base'" in message and "cannot call tools" in message and "jinja chat template" in message


def test_image_on_a_text_model_is_a_400_naming_mmproj(svc: Service) -> None:
    part = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    with svc.client() as c:
        r = c.post("/v1/chat/completions", json=_chat(messages=[{"role": "user", "content": [part]}]))
    assert r.status_code == 400
    message = r.json()["error"]["message"]
    assert "'tiny'" in message and 'mmproj = "auto"' in message and "[models.tiny]" in message


def test_context_error_says_the_slots_share_the_context(svc: Service) -> None:
    """Its 4 slots share one KV cache (issue 37: forge's default), so a request may use all 1024
    tokens: a ~300-token prompt, refused before with "per slot: 256", is served; a ~1,200-token one
    is told the whole context (the per-slot arithmetic with kv_unified = false:
    test_kv_unified_real.py)."""
    with svc.client() as c:
        r = c.post("/v1/completions", json={"model": "tiny", "prompt": "hello " * 100, "max_tokens": 2})
        assert r.status_code == 200, r.text
        assert 256 < r.json()["usage"]["prompt_tokens"] < 1024
        r = c.post("/v1/completions", json={"model": "tiny", "prompt": "hello " * 400, "max_tokens": 2})
    assert r.status_code == 400
    err = r.json()["error"]
    assert "does not fit the context (ctx_size 1024, shared by its 4 slots)" in err["message"], err
    assert "raise ctx_size in [models.tiny]" in err["message"]
    assert err["code"] == "context_length_exceeded"


def test_max_tokens_default_applies_only_when_none_is_sent(svc: Service) -> None:
    client = openai.OpenAI(base_url=f"{svc.url}/v1", api_key="unused", max_retries=0)
    chat = client.chat.completions.create(model="tiny", messages=MSG)  # type: ignore[arg-type]
    assert chat.usage is not None and chat.usage.completion_tokens == 3
    comp = client.completions.create(model="tiny", prompt="Once")
    assert comp.usage is not None and comp.usage.completion_tokens == 3
    chat = client.chat.completions.create(model="tiny", messages=MSG, max_tokens=5)  # type: ignore[arg-type]
    assert chat.usage is not None and chat.usage.completion_tokens == 5


def test_max_tokens_default_applies_to_ollama_too_unless_num_predict_is_sent(svc: Service) -> None:
    """The model's ``max_tokens`` default is the model's, whatever the dialect: Ollama's chat and
    generate get it when ``options.num_predict`` is absent (it used to reach only the OpenAI
    routes: a model with a default of 3 generated hundreds of tokens through ``/api/chat``)."""
    import ollama

    with ollama.Client(host=svc.url) as client:
        chat = client.chat(model="tiny", messages=[{"role": "user", "content": "Hi"}])
        assert chat.eval_count == 3
        gen = client.generate(model="tiny", prompt="Once")
        assert gen.eval_count == 3
        gen = client.generate(model="tiny", prompt="Once", options={"num_predict": 5})
        assert gen.eval_count == 5


def test_embeddings_with_openai_and_langchain(svc: Service) -> None:
    client = openai.OpenAI(base_url=f"{svc.url}/v1", api_key="unused", max_retries=0)
    out = client.embeddings.create(model="emb", input=["hello", "world"])
    assert len(out.data) == 2 and len(out.data[0].embedding) > 8

    from langchain_openai import OpenAIEmbeddings

    lc = OpenAIEmbeddings(
        model="emb",
        base_url=f"{svc.url}/v1",
        api_key="unused",
        check_embedding_ctx_length=False,  # type: ignore[arg-type]
    )
    vectors = lc.embed_documents(["a cat", "a dog"])
    assert len(vectors) == 2 and len(vectors[0]) == len(out.data[0].embedding)
    assert len(lc.embed_query("a bird")) == len(vectors[0])


def test_embeddings_estimate_matches_what_the_child_allocated(svc: Service) -> None:
    """`embeddings = true` (forge adds --embeddings --pooling mean): the service's estimate counts
    the ubatch of logits the child allocates for it, as `forge ps --json` shows (the issue: 196 MiB
    estimated, 283 MiB allocated); the same file without it as a control."""
    for name in ("emb", "noemb"):
        memory = svc.model(name)["memory"]
        estimated, actual = sum(memory["estimated_bytes"].values()), sum(memory["actual_bytes"].values())
        assert actual and abs(estimated - actual) <= 0.10 * actual, (name, estimated, actual)
    emb, noemb = (sum(svc.model(n)["memory"]["actual_bytes"].values()) for n in ("emb", "noemb"))
    assert emb > noemb  # the difference the estimate has to see is real


def test_embeddings_on_a_model_without_the_key_says_which_key(svc: Service) -> None:
    client = openai.OpenAI(base_url=f"{svc.url}/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError, match=r"embeddings = true in \[models.noemb\]"):
        client.embeddings.create(model="noemb", input="hello")


def test_queue_zero_admits_up_to_max_concurrency(
    tmp_path: Path, gemma_path: Path, llama_server_bin: Path
) -> None:
    # gemma, so that a request really holds the only slot for a while.
    cfg = write_config(
        tmp_path / "forge.toml",
        FAST + model_section("q0", gemma_path, preload=True, parallel=1, max_concurrency=1, queue=0),
    )
    with running_service(cfg, tmp_path / "state", llama_server_bin) as svc, svc.client() as c:
        r = c.post("/v1/completions", json={"model": "q0", "prompt": "x", "max_tokens": 1})
        assert r.status_code == 200, r.text  # idle model, queue = 0: not a 429
        started, done = threading.Event(), threading.Event()

        def hold() -> None:
            body = {"model": "q0", "prompt": "Tell a long story.", "max_tokens": 200, "stream": True}
            with (
                httpx.Client(base_url=svc.url, timeout=120) as h,
                h.stream("POST", "/v1/completions", json=body) as s,
            ):
                for _ in s.iter_lines():
                    started.set()
                    if done.is_set():
                        break  # closing the stream frees the slot: no need to wait for 200 tokens

        t = threading.Thread(target=hold)
        t.start()
        try:
            assert started.wait(60)
            wait_for(lambda: svc.model("q0")["in_flight"] == 1, what="one in flight")
            r = c.post("/v1/completions", json={"model": "q0", "prompt": "x", "max_tokens": 1})
            assert r.status_code == 429 and r.json()["error"]["code"] == "queue_full"
            assert "max_concurrency = 1, queue = 0" in r.json()["error"]["message"]
        finally:
            done.set()
            t.join(60)


def test_openapi_document_is_valid_and_lists_the_v1_routes(svc: Service) -> None:
    from openapi_spec_validator import validate

    with svc.client() as c:
        doc = c.get("/api/openapi.json").json()
        page = c.get("/api/docs")
    validate(doc)  # raises on an invalid document
    paths = doc["paths"]
    assert "post" in paths["/v1/chat/completions"] and "post" in paths["/v1/embeddings"]
    assert paths["/v1/models/{model_id}"]["get"]["parameters"][0]["name"] == "model_id"
    assert "post" in paths["/api/models/{name}/load"] and "get" in paths["/api/events"]
    for upload in ("/v1/files", "/v1/audio/transcriptions"):  # forms, not JSON
        body = paths[upload]["post"]["requestBody"]["content"]
        assert list(body) == ["multipart/form-data"], body
        assert body["multipart/form-data"]["schema"]["properties"]["file"]["format"] == "binary"
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "/v1/chat/completions" in page.text and "/api/models/{name}/load" in page.text
    assert "<script" not in page.text and "https://" not in page.text  # nothing from other origins


def test_metrics_a_dashboard_needs(svc: Service) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    with svc.client() as c:
        assert c.post("/v1/chat/completions", json=_chat()).status_code == 200
        text = c.get("/metrics").text
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }

    def value(name: str, **labels: str) -> float:
        return samples[(name, tuple(sorted(labels.items())))]

    assert value("forge_model_load_seconds_count", model="tiny") == 1
    assert value("forge_model_load_seconds_sum", model="tiny") > 0
    assert value("forge_request_queue_seconds_count", model="tiny") >= 1
    assert value("forge_request_generation_seconds_count", model="tiny") >= 1
    assert value("forge_model_memory_bytes", model="tiny", device="cpu", kind="estimated") > 0
    assert value("forge_model_rss_bytes", model="tiny") > 1_000_000
    total = [v for (n, labels), v in samples.items() if n == "forge_device_memory_total_bytes"]
    assert total and all(v > 0 for v in total)
    assert value("process_resident_memory_bytes") > 10_000_000
    assert ("process_cpu_seconds_total", ()) in samples
