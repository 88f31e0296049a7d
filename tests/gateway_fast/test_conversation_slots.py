"""The per-conversation tier's bookkeeping, against the FAKE llama-server with ``--fake-slots``
(it keeps what each slot holds, answers ``GET /slots`` and reports a request's reused tokens as
the real one does; tests/gateway/test_conversation_tier.py runs the real server): which slot a
turn goes to, when a saved state is restored, the restore check (llama.cpp #26676), key scoping,
and the byte budget under a 200-turn soak.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from rocmforge_supervisor.supervisor import EventKind
from rocmforge_supervisor.supervisor.contexts._keep_context import SlotState
from tests.gateway_fast.conftest import Serve
from tests.support.gateway import Gateway, poll, serving
from tests.support.supervised import fake_config

pytestmark = pytest.mark.anyio

SCRIPT = Path(__file__).resolve().parents[1] / "support" / "fake_llama_server.py"

ALICE, BOB = "sk-alice-slots", "sk-bob-slots"
KEYS = [{"name": "alice", "key": ALICE}, {"name": "bob", "key": BOB}]
#: Every turn is "long" (600 prompt tokens, over SAVE_MIN_TOKENS), so every turn is saved.
ARGS = ["--fake-slots", "--fake-prompt-tokens", "600"]


def _model(parallel: int = 2, args: tuple[str, ...] = ()) -> dict[str, dict[str, Any]]:
    return {
        "m": {
            "preload": True,
            "parallel": parallel,
            "keep_context": True,
            "keep_conversations": True,
            "args": [*ARGS, *args],
        }
    }


async def _turn(gw: Gateway, messages: list[dict[str, str]], key: str = ALICE) -> dict[str, Any]:
    r = await gw.client.post(
        "/v1/chat/completions",
        json={"model": "m", "messages": messages, "max_tokens": 3},
        headers={"Authorization": f"Bearer {key}"},
    )
    assert r.status_code == 200, r.text
    answer: dict[str, Any] = r.json()
    messages.append({"role": "assistant", "content": answer["choices"][0]["message"]["content"]})
    return answer


def _ask(messages: list[dict[str, str]], text: str) -> list[dict[str, str]]:
    messages.append({"role": "user", "content": text})
    return messages


def _counters(gw: Gateway) -> dict[str, int]:
    contexts = gw.model("m").contexts
    assert contexts is not None
    c = contexts.conversations
    return {"hits": c.hits, "misses": c.misses, "restores": c.restores, "saves": c.saves}


def _reused(answer: dict[str, Any]) -> int:
    return int(answer["usage"]["prompt_tokens_details"]["cached_tokens"])


def _slot_dir(gw: Gateway) -> Path:
    plan = gw.model("m").plan
    assert plan is not None and plan.slot_save_dir is not None
    return Path(plan.slot_save_dir)


async def test_the_next_turn_goes_back_to_its_slot_and_a_lost_one_is_restored(serve: Serve) -> None:
    async with serve(_model(parallel=2), server={"keys": KEYS}) as gw:
        a = _ask([{"role": "user", "content": "conversation a"}], "a1")
        await _turn(gw, a)
        assert _counters(gw) == {"hits": 0, "misses": 0, "restores": 0, "saves": 1}
        # The next turn of a: its slot still holds it, so no restore, and the child reuses it.
        answer = await _turn(gw, _ask(a, "a2"))
        assert _counters(gw)["hits"] == 1 and _counters(gw)["restores"] == 0
        assert _reused(answer) > 0
        # Two other conversations take both slots (the oldest-held slot first: a's).
        for name in ("b", "c"):
            await _turn(gw, _ask([{"role": "user", "content": f"conversation {name}"}], f"{name}1"))
        # a comes back: its slot holds c now, so its saved state is restored and reused.
        answer = await _turn(gw, _ask(a, "a3"))
        assert _counters(gw)["restores"] == 1 and _counters(gw)["hits"] == 2
        assert _reused(answer) > 0
        # Every turn saved; the states a later turn superseded are the budget's first to go.
        entries = gw.model("m").contexts.store.entries("m")  # type: ignore[union-attr]
        assert len(entries) == 5
        assert sorted(e.used_at == 0.0 for e in entries) == [False, False, False, True, True]


async def test_a_request_outside_the_tier_voids_what_the_slots_were_known_to_hold(serve: Serve) -> None:
    async with serve(_model(parallel=1), server={"keys": KEYS}) as gw:
        a = _ask([{"role": "user", "content": "conversation a"}], "a1")
        await _turn(gw, a)
        r = await gw.client.post(
            "/v1/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True},
            headers={"Authorization": f"Bearer {ALICE}"},
        )
        assert r.status_code == 200
        # The stream went to some slot forge does not track: a's next turn restores from disk.
        await _turn(gw, _ask(a, "a2"))
        assert _counters(gw)["restores"] == 1


async def test_another_keys_turn_never_finds_the_state(serve: Serve) -> None:
    async with serve(_model(parallel=1), server={"keys": KEYS}) as gw:
        a = _ask([{"role": "user", "content": "shared words"}], "q1")
        await _turn(gw, a, key=ALICE)
        bob = [dict(m) for m in a]  # the same messages, byte for byte
        answer = await _turn(gw, _ask(bob, "q2"), key=BOB)
        c = _counters(gw)
        assert c["misses"] == 1 and c["hits"] == 0 and c["restores"] == 0
        assert _reused(answer) == 0  # the slot held alice's turn: emptied before bob's
        # Alice's own next turn finds her state (bob's turn took the one slot): restored.
        await _turn(gw, _ask(a, "q2"), key=ALICE)
        assert _counters(gw)["restores"] == 1


async def test_a_restore_the_child_does_not_reuse_turns_the_tier_off(serve: Serve) -> None:
    async with serve(_model(parallel=1, args=("--fake-restore-noop",)), server={"keys": KEYS}) as gw:
        a = _ask([{"role": "user", "content": "conversation a"}], "a1")
        await _turn(gw, a)
        await _turn(gw, _ask([{"role": "user", "content": "conversation b"}], "b1"))
        await _turn(gw, _ask(a, "a2"))  # restored, but the child computes it from 0
        contexts = gw.model("m").contexts
        assert contexts is not None
        assert contexts.book.off is not None and "#26676" in contexts.book.off
        saves = _counters(gw)["saves"]
        await _turn(gw, _ask(a, "a3"))
        assert _counters(gw)["saves"] == saves  # off: nothing more saved or restored
        warnings = [e for e in gw.sup.events.history("m") if e.kind == EventKind.CONTEXT_WARNING]
        assert any("per-conversation context tier is off" in str(e.data["message"]) for e in warnings)


@pytest.mark.timeout(180)
async def test_the_byte_budget_holds_over_a_200_turn_soak(
    tmp_path: Path, tiny_gguf: Path, fake_bin: Path
) -> None:
    state_bytes = 100 * (600 + 3 - 1)  # the fake's 100 bytes a token: the prompt, all but one reply token
    budget = 5 * state_bytes + 100
    rng = random.Random(35)
    config = fake_config(
        tmp_path, tiny_gguf, _model(parallel=2), server={"keys": KEYS, "context_max_bytes": budget}
    )
    # 200 turns, each a restore or a save: ~25 s on a loaded 2-core box, more than serving's default
    async with serving(config, fake_bin, timeout=150) as gw:
        folder = _slot_dir(gw)
        conversations: list[list[dict[str, str]]] = [
            [{"role": "user", "content": f"conversation {i}"}] for i in range(8)
        ]
        for turn in range(200):
            messages = rng.choice(conversations)
            if messages[-1]["role"] == "assistant":
                _ask(messages, f"turn {turn}")
            await _turn(gw, messages)
            data = list(folder.glob("*.slot"))
            manifests = list(folder.glob("*.json"))
            assert sum(p.stat().st_size for p in data) <= budget, f"turn {turn}"
            assert len(data) <= 5 and {p.stem for p in data} == {p.stem for p in manifests}
            assert not list(folder.glob("tmp-*")), f"turn {turn}: a temporary file was left"
        c = _counters(gw)
        assert c["saves"] == 200
        assert c["hits"] + c["misses"] == 200 - 8  # every turn but each conversation's first
        assert c["restores"] > 0
        listing = await gw.client.get("/api/models", headers={"Authorization": f"Bearer {ALICE}"})
        row = next(m for m in listing.json()["models"] if m["name"] == "m")
        assert row["contexts"]["bytes"] <= budget
        on_disk = sorted(folder.glob("conv-*.slot"))
        assert row["contexts"]["conversation_states"] == len(on_disk) > 0
        assert row["contexts"]["conversation_state_bytes"] == sum(p.stat().st_size for p in on_disk)
        metrics = (await gw.client.get("/metrics", headers={"Authorization": f"Bearer {ALICE}"})).text
        assert f'forge_conversation_states{{model="m"}} {float(len(on_disk))}' in metrics
        assert row["contexts"]["conversation_saves"] == 200
        assert row["contexts"]["conversation_restores"] == c["restores"]


async def _streamed_turn(gw: Gateway, messages: list[dict[str, str]]) -> dict[str, Any]:
    """A streamed turn read as a client reads it; the reply appended; the last event's timings."""
    body = {"model": "m", "messages": messages, "max_tokens": 3, "stream": True}
    headers = {"Authorization": f"Bearer {ALICE}"}
    text, timings = [], {}
    async with gw.client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if line.startswith("data: {"):
                event = json.loads(line[6:])
                text.append(event["choices"][0].get("delta", {}).get("content") or "")
                timings = event.get("timings") or timings
    messages.append({"role": "assistant", "content": "".join(text)})
    return timings


async def test_streamed_turns_take_part_like_whole_ones(serve: Serve) -> None:
    async with serve(_model(parallel=1), server={"keys": KEYS}) as gw:
        a = _ask([{"role": "user", "content": "conversation a"}], "a1")
        await _streamed_turn(gw, a)
        await poll(lambda: _counters(gw)["saves"] == 1, what="the streamed turn saved")
        timings = await _streamed_turn(gw, _ask(a, "a2"))
        assert _counters(gw)["hits"] == 1 and timings["cache_n"] > 0  # went back to its slot
        await _turn(gw, _ask([{"role": "user", "content": "conversation b"}], "b1"))
        timings = await _streamed_turn(gw, _ask(a, "a3"))  # b took the slot: restored from disk
        assert _counters(gw)["restores"] == 1 and timings["cache_n"] > 0


async def test_a_stream_the_client_leaves_is_not_saved(serve: Serve) -> None:
    slow = ("--fake-chunks", "20", "--fake-token-delay", "0.1")
    async with serve(_model(parallel=1, args=slow), server={"keys": KEYS}) as gw:
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
        async with gw.client.stream(
            "POST", "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {ALICE}"}
        ) as r:
            assert r.status_code == 200
            async for line in r.aiter_lines():
                if line.startswith("data: "):
                    break  # the client leaves after the first event
        await poll(lambda: gw.model("m").in_flight == 0, what="the cut stream's end")
        server = gw.model("m").server
        assert server is not None

        with anyio.fail_after(5):  # the child notices the client gone at its next write
            while any(s.processing for s in SlotState.parse(await server.slots())):  # noqa: ASYNC110
                await anyio.sleep(0.02)
        await _turn(gw, _ask([{"role": "user", "content": "conversation c"}], "c1"))
        assert _counters(gw)["saves"] == 1  # c's, not the cut stream's


async def test_a_build_whose_self_test_found_restore_a_no_op_starts_with_the_tier_off(
    tmp_path: Path, tiny_gguf: Path
) -> None:
    fake = tmp_path / "noop" / "llama-server"  # the FAKE, its restores no-ops (llama.cpp #26676)
    fake.parent.mkdir()
    script = SCRIPT
    fake.write_text(
        f'#!/bin/bash\nexport FAKE_LLAMA_RESTORE_NOOP=1\nexec -a llama-server "{sys.executable}" "{script}" "$@"\n'
    )
    fake.chmod(0o755)
    config = fake_config(tmp_path, tiny_gguf, _model(parallel=1), server={"keys": KEYS})
    async with serving(config, fake) as gw:
        a = _ask([{"role": "user", "content": "conversation a"}], "a1")
        await _turn(gw, a)
        await _turn(gw, _ask(a, "a2"))
        assert _counters(gw) == {"hits": 0, "misses": 0, "restores": 0, "saves": 0}
        listing = await gw.client.get("/api/models", headers={"Authorization": f"Bearer {ALICE}"})
        row = next(m for m in listing.json()["models"] if m["name"] == "m")
        assert (
            "self-test" in row["contexts"]["conversation_off"]
            and "#26676" in row["contexts"]["conversation_off"]
        )


@pytest.mark.parametrize("stream", [False, True])
async def test_ollama_chat_turns_take_part_too(serve: Serve, stream: bool) -> None:
    """Ollama's /api/chat goes to the child as OpenAI's chat: the same turns, the same tier."""
    async with serve(_model(parallel=1), server={"keys": KEYS}) as gw:
        headers = {"Authorization": f"Bearer {ALICE}"}

        async def turn(messages: list[dict[str, str]]) -> None:
            body = {"model": "m", "messages": messages, "stream": stream}
            r = await gw.client.post("/api/chat", json=body, headers=headers)
            assert r.status_code == 200, r.text
            lines = [json.loads(line) for line in r.text.splitlines() if line.strip()]
            reply = "".join(line["message"]["content"] for line in lines)
            messages.append({"role": "assistant", "content": reply})

        a = _ask([{"role": "user", "content": "conversation a"}], "a1")
        await turn(a)
        await poll(lambda: _counters(gw)["saves"] == 1, what="the first turn saved")
        await turn(_ask(a, "a2"))
        assert _counters(gw)["hits"] == 1
        await _turn(gw, _ask([{"role": "user", "content": "conversation b"}], "b1"))  # takes the slot
        await turn(_ask(a, "a3"))
        assert _counters(gw)["restores"] == 1 and _counters(gw)["hits"] == 2


async def test_a_damaged_state_is_deleted_with_an_event_and_the_turn_computes_cold(serve: Serve) -> None:
    async with serve(_model(parallel=1), server={"keys": KEYS}) as gw:
        a = _ask([{"role": "user", "content": "conversation a"}], "a1")
        await _turn(gw, a)
        await _turn(gw, _ask([{"role": "user", "content": "conversation b"}], "b1"))  # takes the slot
        for slot in _slot_dir(gw).glob("conv-*.slot"):
            slot.write_bytes(slot.read_bytes()[:100])  # truncated: the manifest's size no longer holds
        answer = await _turn(gw, _ask(a, "a2"))  # answered, without a restore (the child computes it)
        assert _counters(gw)["restores"] == 0 and _counters(gw)["hits"] == 0
        assert _counters(gw)["misses"] == 1, answer
        deleted = [e for e in gw.sup.events.history("m") if e.kind == EventKind.CONTEXT_DELETED]
        assert any("truncated" in str(e.data.get("reason")) for e in deleted), deleted
