"""A model's ``fallback`` at the gateway, as a matrix: every reason a model cannot take a request
(a residency rule refuses its load, its load failed) × every dialect × streamed or whole. The
local children are the FAKE llama-server on the rx7900xtx fixture (24 GiB: two big models fit,
not three); the fallback is a FAKE OpenAI-only peer (tests/support/fake_peer.py). An Anthropic
request passed through to llama-server goes to no OpenAI-only peer: its refusal stands."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rocmforge_supervisor.supervisor import EventKind
from tests.gateway_fast.conftest import Serve
from tests.gateway_fast.dialects import DIALECTS, Dialect, chat
from tests.support.fake_peer import FakePeer

pytestmark = pytest.mark.anyio

BIG = {"ctx_size": 8_000_000, "parallel": 1, "gpu": 0}


@pytest.fixture
def peer() -> Iterator[FakePeer]:
    with FakePeer(api="openai", models=["m1"]) as p:
        yield p


def _residency(tmp_path: Path) -> tuple[dict[str, dict[str, Any]], int]:
    models = {
        "kept": {**BIG, "pinned": True, "preload": True},
        "stays": {**BIG, "swap": "never", "preload": True},
        "new": {**BIG, "fallback": ["far/m1"]},
    }
    return models, 409


def _failed(tmp_path: Path) -> tuple[dict[str, dict[str, Any]], int]:
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\0" * 12)  # a truncated GGUF: the load fails for good
    return {"new": {"path": str(broken), "gpu": "cpu", "fallback": ["far/m1"]}}, 500


#: Each reason a model cannot take a request → its models (the one asked is "new") and the
#: status the client gets when no fallback takes the request.
REASONS = {"residency": _residency, "failed": _failed}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("reason", sorted(REASONS))
async def test_a_request_the_model_cannot_take_goes_to_its_fallback(
    reason: str, dialect: Dialect, stream: bool, serve: Serve, peer: FakePeer, tmp_path: Path
) -> None:
    models, refused = REASONS[reason](tmp_path)
    peers = {"far": {"url": peer.url, "models": ["m1"]}}
    async with serve(models, machine="rx7900xtx", peers=peers) as gw:
        path, body = chat(dialect, "new", stream=stream)
        r = await gw.client.post(path, json=body)
        sent = [q for q in peer.requests if q.method == "POST"]
        if dialect == "anthropic":  # llama-server's own Messages: no OpenAI-only peer takes it
            assert r.status_code == refused, r.text
            assert sent == []
            return
        assert r.status_code == 200, r.text
        if not stream:  # (a stream has the same words, one chunk each)
            assert "echo from m1" in r.text
        assert [q.json["model"] for q in sent if q.json] == ["m1"]  # the peer's own id
        fell = [e for e in gw.sup.events.history() if e.kind == EventKind.FALLBACK]
        assert [(e.model, e.data["to"]) for e in fell] == [("new", "far/m1")]


async def test_a_fallback_the_key_may_not_use_is_skipped(
    serve: Serve, peer: FakePeer, tmp_path: Path
) -> None:
    models, refused = _residency(tmp_path)
    server = {"api_key": "admin", "keys": [{"name": "only-new", "key": "k-new", "models": ["new"]}]}
    peers = {"far": {"url": peer.url, "models": ["m1"]}}
    async with serve(models, machine="rx7900xtx", peers=peers, server=server) as gw:
        path, body = chat("openai", "new", stream=False)
        r = await gw.client.post(path, json=body, headers={"Authorization": "Bearer k-new"})
        assert r.status_code == refused, r.text
        assert [q for q in peer.requests if q.method == "POST"] == []
        r = await gw.client.post(path, json=body, headers={"Authorization": "Bearer admin"})
        assert r.status_code == 200, r.text


async def test_a_cooling_peer_is_skipped_for_the_next_entry(serve: Serve, tmp_path: Path) -> None:
    with FakePeer(api="openai", models=["m1"]) as down, FakePeer(api="openai", models=["m1"]) as up:
        models, _ = _residency(tmp_path)
        models["new"]["fallback"] = ["down/m1", "up/m1"]
        peers = {"down": {"url": down.url, "models": ["m1"]}, "up": {"url": up.url, "models": ["m1"]}}
        async with serve(models, machine="rx7900xtx", peers=peers) as gw:
            gw.sup.peers.failed("down", "refused")  # as a refused connection would
            path, body = chat("openai", "new", stream=False)
            r = await gw.client.post(path, json=body)
            assert r.status_code == 200, r.text
            assert [q for q in down.requests if q.method == "POST"] == []
            assert len([q for q in up.requests if q.method == "POST"]) == 1
