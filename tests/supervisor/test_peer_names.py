"""How a peer's models are named (``PeerSet``, pure): ``PEER/ID`` always, ``[prefix]ID`` unless a
local model or another peer has it; an ambiguous short name is a 400 listing the choices; the
breaker refuses a cooling peer at once."""

from __future__ import annotations

import time

import pytest

from rocmforge_supervisor._errors import InvalidRequest, ModelNotFound, ServerUnavailable
from rocmforge_supervisor.config import PeerConfig
from rocmforge_supervisor.supervisor._peers import PeerSet

pytestmark = pytest.mark.anyio


def _peers(local: set[str], **peers: PeerConfig) -> PeerSet:
    return PeerSet(peers, lambda: local)


def _peer(models: list[str], **kw: object) -> PeerConfig:
    return PeerConfig.model_validate({"url": "http://127.0.0.1:9", "models": models, **kw})


def test_qualified_and_short_names_local_wins_ambiguous_refused() -> None:
    ps = _peers(
        {"qwen"}, a=_peer(["qwen", "llama", "only-a"]), b=_peer(["llama"]), c=_peer(["x"], prefix="c-")
    )
    assert set(ps.served) == {"a/qwen", "a/llama", "a/only-a", "b/llama", "c/x", "only-a", "c-x"}
    assert ps.find("qwen") is None  # the local model's name
    found = ps.find("only-a")
    assert found is not None and (found.peer, found.model_id) == ("a", "only-a")
    prefixed = ps.find("c-x")
    assert prefixed is not None and (prefixed.peer, prefixed.model_id) == ("c", "x")
    with pytest.raises(InvalidRequest) as err:
        ps.find("llama")
    assert "a/llama, b/llama" in err.value.message
    with pytest.raises(ModelNotFound):
        ps.get("nope")
    # One listing entry per peer model, by its short name when it has one.
    assert sorted(pm.served for pm in ps.shown()) == ["a/llama", "a/qwen", "b/llama", "c-x", "only-a"]


def test_a_peer_models_config_has_its_apis_routes() -> None:
    ps = _peers(set(), o=_peer(["m"]), n=_peer(["c"], api="anthropic"))
    assert "/v1/chat/completions" in ps.get("o/m").config.command_routes
    assert ps.get("n/c").config.command_routes == ("/v1/messages", "/v1/messages/count_tokens")
    assert ps.get("o/m").config.backend == "peer"


async def test_a_cooling_peer_is_refused_at_once_then_tried_again() -> None:
    ps = _peers(set(), o=_peer(["m"], cooldown=60))
    async with ps.acquire("m") as upstream:
        assert upstream.peer == "o" and upstream.model == "m"
    ps.failed("o", "refused")
    with pytest.raises(ServerUnavailable, match="cooling down"):
        async with ps.acquire("m"):
            pass
    assert ps.status(ps.get("m")).state.value == "failed"
    ps.peers["o"].cooled_until = time.monotonic()  # the cooldown is over
    async with ps.acquire("m"):
        pass
    ps.answered("o")
    assert ps.status(ps.get("m")).state.value == "ready" and ps.peers["o"].last_error is None


def test_a_missing_key_variable_is_named() -> None:
    ps = _peers(set(), o=_peer(["m"], api_key_env="NO_SUCH_VAR_FOR_FORGE"))
    with pytest.raises(ServerUnavailable, match="NO_SUCH_VAR_FOR_FORGE"):
        ps.peers["o"].upstream("m")
