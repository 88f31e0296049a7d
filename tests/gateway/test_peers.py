"""Peers: a real ``forge serve`` whose ``[peers.*]`` are FAKE servers (tests/support/fake_peer.py,
an OpenAI-only one and an Anthropic-only one, checked against the real client libraries there),
and a second real ``forge serve`` as a forge peer of the first.

One service per module for what only reads or sends requests; the breaker and the dead peers
get a service of their own (they change a peer's state).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.support.fake_peer import FakePeer
from tests.support.service import FAST, FORGE, Service, model_section, running_service, wait_for, write_config

ADMIN = "admin-key"
SCOPED = "scoped-key"
LIMITED = "limited-key"
OA_KEY = "oa-peer-secret"
AN_KEY = "an-peer-secret"
ENV = {"OA_PEER_KEY": OA_KEY, "AN_PEER_KEY": AN_KEY}


@pytest.fixture(scope="module")
def oa_peer() -> Iterator[FakePeer]:
    with FakePeer(api="openai", models=["m1", "m2"], key=OA_KEY) as peer:
        yield peer


@pytest.fixture(scope="module")
def an_peer() -> Iterator[FakePeer]:
    with FakePeer(api="anthropic", models=["claude-x"], key=AN_KEY) as peer:
        yield peer


@pytest.fixture(scope="module")
def svc(
    tmp_path_factory: pytest.TempPathFactory, oa_peer: FakePeer, an_peer: FakePeer, llama_server_bin: Path
) -> Iterator[Service]:
    d = tmp_path_factory.mktemp("peers")
    broken = d / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\0" * 12)  # a truncated GGUF: the local model fails at load
    cfg = write_config(
        d / "forge.toml",
        f"""
[server]
api_key = "{ADMIN}"
[[server.keys]]
name = "scoped"
key = "{SCOPED}"
models = ["m1"]
[[server.keys]]
name = "limited"
key = "{LIMITED}"
requests_per_minute = 2
{FAST}
{model_section("local", broken, fallback=["oa/m1"])}
[peers.oa]
url = "{oa_peer.url}/v1"
api_key_env = "OA_PEER_KEY"
cooldown = 0.5
[peers.an]
url = "{an_peer.url}"
api = "anthropic"
api_key_env = "AN_PEER_KEY"
models = ["claude-x"]
""",
    )
    with running_service(cfg, d / "state", llama_server_bin, api_key=ADMIN, extra_env=ENV) as s:
        wait_for(lambda: "m1" in _ids(s), timeout=20, what="the peer's models listed")
        yield s


def _ids(s: Service, key: str = ADMIN) -> list[str]:
    with httpx.Client(base_url=s.url, timeout=10) as c:
        return [m["id"] for m in c.get("/v1/models", headers=_auth(key)).json()["data"]]


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_peer_models_are_listed_everywhere_with_their_peer(svc: Service) -> None:
    with svc.client() as c:
        data = {m["id"]: m for m in c.get("/v1/models").json()["data"]}
        assert {"m1", "m2", "claude-x"} <= set(data)
        assert data["m1"]["peer"] == "oa" and data["claude-x"]["peer"] == "an"
        assert data["m1"]["backend"] == "peer"
        tags = [m["name"] for m in c.get("/api/tags").json()["models"]]
        assert {"m1", "m2", "claude-x"} <= {t.removesuffix(":latest") for t in tags}
        rows = {r["name"]: r for r in c.get("/api/models").json()["models"]}
        assert rows["m2"]["peer"] == "oa" and rows["m2"]["url"].startswith("http://127.0.0.1:")
        assert "m1" not in [m["name"] for m in c.get("/api/ps").json()["models"]]  # not loaded here


def test_openai_client_through_forge_to_the_peer_with_the_peers_key(svc: Service, oa_peer: FakePeer) -> None:
    client = openai.OpenAI(base_url=f"{svc.url}/v1", api_key=ADMIN, timeout=30, max_retries=0)
    before = len(oa_peer.requests)
    r = client.chat.completions.create(
        model="m1",
        messages=[{"role": "user", "content": "hello peer"}],
        extra_headers={"X-Request-ID": "rid-42"},
    )
    assert r.choices[0].message.content == "echo from m1: hello peer"
    streamed = client.chat.completions.create(
        model="oa/m2", messages=[{"role": "user", "content": "streamed"}], stream=True
    )
    text = "".join(ch.choices[0].delta.content or "" for ch in streamed if ch.choices)
    assert text == "echo from m2: streamed"
    sent = [q for q in oa_peer.requests[before:] if q.path == "/v1/chat/completions"]
    assert [q.json["model"] for q in sent if q.json] == ["m1", "m2"]  # the peer's own ids
    for q in sent:
        assert q.headers["authorization"] == f"Bearer {OA_KEY}"
        assert ADMIN not in json.dumps(q.headers)  # the client's key never reaches the peer
    assert sent[0].headers.get("x-request-id") == "rid-42"


def test_a_scoped_key_sees_and_uses_only_its_peer_model(svc: Service) -> None:
    assert _ids(svc, SCOPED) == ["m1"]
    with httpx.Client(base_url=svc.url, timeout=30, headers=_auth(SCOPED)) as c:
        body = {"model": "m2", "messages": [{"role": "user", "content": "x"}]}
        assert c.post("/v1/chat/completions", json=body).status_code == 403
        body["model"] = "m1"
        assert c.post("/v1/chat/completions", json=body).status_code == 200


def test_anthropic_sdk_with_tools_streamed_through_an_openai_only_peer(
    svc: Service, oa_peer: FakePeer
) -> None:
    client = anthropic.Anthropic(base_url=svc.url, api_key=ADMIN, timeout=30, max_retries=0)
    tools = [
        {
            "name": "get_weather",
            "description": "the weather in a city",
            "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
        }
    ]
    with client.messages.stream(
        model="m1",
        max_tokens=64,
        system="be brief",
        tools=tools,  # type: ignore[arg-type]
        messages=[{"role": "user", "content": "what is the weather in Paris?"}],
    ) as stream:
        final = stream.get_final_message()
    uses = [b for b in final.content if b.type == "tool_use"]
    assert uses and uses[0].name == "get_weather" and uses[0].input == {"city": "Paris"}
    assert final.stop_reason == "tool_use"
    sent = [
        q for q in oa_peer.requests if q.path == "/v1/chat/completions" and q.json and q.json.get("tools")
    ]
    assert sent and sent[-1].json is not None and sent[-1].json["messages"][0]["role"] == "system"
    whole = client.messages.create(model="m1", max_tokens=32, messages=[{"role": "user", "content": "plain"}])
    assert whole.content[0].type == "text" and whole.content[0].text == "echo from m1: plain"


def test_anthropic_sdk_to_an_anthropic_peer_sends_its_key_as_x_api_key(
    svc: Service, an_peer: FakePeer
) -> None:
    client = anthropic.Anthropic(base_url=svc.url, api_key=ADMIN, timeout=30, max_retries=0)
    before = len(an_peer.requests)
    msg = client.messages.create(
        model="claude-x", max_tokens=32, messages=[{"role": "user", "content": "hi anthropic"}]
    )
    assert msg.content[0].type == "text" and "hi anthropic" in msg.content[0].text
    sent = [q for q in an_peer.requests[before:] if q.path == "/v1/messages"]
    assert sent[0].headers["x-api-key"] == AN_KEY and "authorization" not in sent[0].headers


def test_a_failed_local_model_falls_back_to_its_peer_before_any_byte(svc: Service, oa_peer: FakePeer) -> None:
    with svc.client() as c:
        r = c.post(
            "/v1/chat/completions", json={"model": "local", "messages": [{"role": "user", "content": "fb"}]}
        )
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"] == "echo from m1: fb"
    fell = _event(svc, "fallback")
    assert fell["model"] == "local" and fell["data"]["to"] == "oa/m1"


def test_a_peer_that_fails_is_cooled_down_and_skipped(tmp_path: Path, llama_server_bin: Path) -> None:
    with FakePeer(api="openai", models=["m1"], key=OA_KEY) as flaky:
        cfg = write_config(
            tmp_path / "forge.toml",
            f"""
[peers.flaky]
url = "{flaky.url}"
api_key_env = "OA_PEER_KEY"
models = ["m1"]
cooldown = 60
[peers.dead]
url = "http://127.0.0.1:{_closed_port()}"
models = ["d1"]
[peers.slow]
url = "{flaky.url}"
api_key_env = "OA_PEER_KEY"
models = ["m1"]
prefix = "slow-"
timeouts = {{ first_byte = 1.0 }}
""",
        )
        with running_service(cfg, tmp_path / "state", llama_server_bin, extra_env=ENV) as s, s.client() as c:
            body = {"model": "flaky/m1", "messages": [{"role": "user", "content": "x"}]}
            assert c.post("/v1/chat/completions", json=body).status_code == 200
            flaky.mode = "error500"
            assert c.post("/v1/chat/completions", json=body).status_code >= 500
            seen = len(flaky.requests)
            t0 = time.monotonic()
            r = c.post("/v1/chat/completions", json=body)
            assert r.status_code == 503 and "cooling down" in r.json()["error"]["message"]
            assert time.monotonic() - t0 < 2 and len(flaky.requests) == seen  # refused here
            assert s.model("m1")["state"] == "failed" and s.model("m1")["peer"] == "flaky"
            cooled = _event(s, "peer")
            assert cooled["model"] == "flaky" and cooled["state"] == "cooling"
            # A dead peer: refused at once, and it slows no listing.
            t0 = time.monotonic()
            assert "d1" in [m["id"] for m in c.get("/v1/models").json()["data"]]
            assert time.monotonic() - t0 < 2
            r = c.post("/v1/chat/completions", json={**body, "model": "dead/d1"})
            assert r.status_code == 503 and "dead" in r.json()["error"]["message"]
            # A peer that hangs: its first_byte timeout ends the request.
            flaky.mode = "hang"
            t0 = time.monotonic()
            r = c.post("/v1/chat/completions", json={**body, "model": "slow-m1"})
            assert r.status_code == 503 and "in time" in r.json()["error"]["message"]
            assert time.monotonic() - t0 < 10
            flaky.mode = "ok"


def test_a_second_forge_serves_the_first_ones_model(
    tmp_path: Path, tiny_gguf: Path, llama_server_bin: Path
) -> None:
    """Two real forge serve on loopback, the first a forge peer of the second: a request to the
    second reaches the first's real child."""
    shutil.copy(tiny_gguf, tmp_path / "tiny.gguf")
    first_cfg = write_config(
        tmp_path / "first.toml",
        f'[server]\napi_key = "first-key"\n{FAST}' + model_section("tiny", tmp_path / "tiny.gguf"),
    )
    with running_service(first_cfg, tmp_path / "s1", llama_server_bin, api_key="first-key") as first:
        second_cfg = write_config(
            tmp_path / "second.toml",
            f"""
[peers.box]
url = "{first.url}"
api = "forge"
api_key_env = "BOX_KEY"
prefix = "box-"
""",
        )
        with (
            running_service(
                second_cfg, tmp_path / "s2", llama_server_bin, extra_env={"BOX_KEY": "first-key"}
            ) as second,
            second.client() as c,
        ):
            wait_for(lambda: "box-tiny" in [m["id"] for m in c.get("/v1/models").json()["data"]], timeout=20)
            r = c.post(
                "/v1/completions", json={"model": "box-tiny", "prompt": "Hello", "max_tokens": 4}, timeout=120
            )
            assert r.status_code == 200, r.text
            assert r.json()["usage"]["completion_tokens"] >= 1
            assert first.model("tiny")["state"] == "ready"


def _event(s: Service, kind: str, timeout: float = 20.0) -> dict[str, Any]:
    """The first event of ``kind`` in the service's history (``/api/events?replay=1``)."""
    deadline = time.monotonic() + timeout
    with (
        httpx.Client(base_url=s.url, headers=s.headers, timeout=timeout) as c,
        c.stream("GET", "/api/events?replay=1") as r,
    ):
        for line in r.iter_lines():
            if line.startswith("data: "):
                event: dict[str, Any] = json.loads(line[6:])
                if event["kind"] == kind:
                    return event
            if time.monotonic() > deadline:
                break
    raise AssertionError(f"no {kind} event")


def _closed_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_openai_client_to_an_anthropic_only_peer_is_translated(svc: Service, an_peer: FakePeer) -> None:
    client = openai.OpenAI(base_url=f"{svc.url}/v1", api_key=ADMIN, timeout=30, max_retries=0)
    before = len(an_peer.requests)
    r = client.chat.completions.create(
        model="claude-x",
        messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi from openai"}],
    )
    assert r.choices[0].message.content is not None and "hi from openai" in r.choices[0].message.content
    assert r.usage is not None and r.usage.completion_tokens > 0
    streamed = client.chat.completions.create(
        model="claude-x", messages=[{"role": "user", "content": "streamed too"}], stream=True
    )
    text = "".join(ch.choices[0].delta.content or "" for ch in streamed if ch.choices)
    assert "streamed too" in text
    sent = [q for q in an_peer.requests[before:] if q.path == "/v1/messages"]
    assert len(sent) == 2 and sent[0].json is not None
    assert sent[0].json["system"] == "be brief" and sent[0].json["max_tokens"] > 0
    assert sent[0].headers["x-api-key"] == AN_KEY


def test_forge_ps_names_each_peer_models_peer(svc: Service) -> None:
    env = dict(
        os.environ, FORGE_STATE_DIR=str(svc.state_dir), FORGE_API_KEY=ADMIN, COLUMNS="250", NO_COLOR="1"
    )
    out = subprocess.run([*FORGE, "ps"], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    rows = {line.split("│")[1].strip(): line for line in out.stdout.splitlines() if line.count("│") > 3}
    assert "peer oa" in rows["m1"] and "peer an" in rows["claude-x"], out.stdout


def test_a_peer_request_is_logged_charged_and_limited_like_a_local_one(svc: Service) -> None:
    body = {"model": "m2", "messages": [{"role": "user", "content": "count me please"}]}
    with httpx.Client(base_url=svc.url, timeout=30, headers=_auth(LIMITED)) as c:
        first = c.post("/v1/chat/completions", json=body)
        assert first.status_code == 200, first.text
        assert c.post("/v1/chat/completions", json=body).status_code == 200
        over = c.post("/v1/chat/completions", json=body)
        assert over.status_code == 429 and "Retry-After" in over.headers
    used = first.json()["usage"]["total_tokens"]
    assert used > 0

    def charged() -> dict[str, Any] | None:
        with svc.client() as c:
            rows = c.get("/api/usage", params={"by": "key", "since": "1h"}).json()["usage"]
        row = next((r for r in rows if r["key"] == "limited"), None)
        return row if row is not None and row["total_tokens"] == 2 * used else None

    assert wait_for(charged, timeout=30, what="the peer's usage charged to the key")
    with svc.client() as c:
        items = c.get("/api/activity", params={"key": "limited", "limit": 10}).json()["activity"]
    assert [r["model"] for r in items if r["status"] == 200] == ["m2", "m2"], items
    assert [r["status"] for r in items].count(429) == 1
