"""The per-conversation tier under each KV layout, with more conversations than the cache holds,
against the FAKE llama-server's model of the slots (``--fake-slots``: a token is a word, a slot
reuses its longest common prefix, and with ``--kv-unified`` the slots share ``--ctx-size`` cells
and llama-server's purge empties idle slots in slot order when they run out;
tests/gateway/test_conversation_tier.py holds the real server to the same purge).

Every returning turn must be answered from its saved state (still in its slot, or restored),
never recomputed, and the counters must say what the child did: a hit is a turn the child reused.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import anyio
import pytest

from tests.gateway_fast.conftest import Serve
from tests.support.gateway import Gateway

pytestmark = pytest.mark.anyio

WORDS = ("apple", "pear", "plum", "fig", "lime", "kiwi", "date", "melon")
#: A first turn of ~560 words: with the reply over SAVE_MIN_TOKENS, so every turn is saved.
FIRST_WORDS = 560


@dataclass(frozen=True)
class Layout:
    name: str
    kv_unified: bool
    parallel: int
    ctx_size: int
    conversations: int  # more than the cache holds at once
    holds: int  # how many of them it holds

    @property
    def shared(self) -> bool:
        return self.kv_unified and self.parallel > 1


LAYOUTS = [
    Layout("unified-1", kv_unified=True, parallel=1, ctx_size=1024, conversations=3, holds=1),
    Layout("unified-4", kv_unified=True, parallel=4, ctx_size=2048, conversations=5, holds=3),
    Layout("split-1", kv_unified=False, parallel=1, ctx_size=1024, conversations=3, holds=1),
    Layout("split-4", kv_unified=False, parallel=4, ctx_size=4096, conversations=6, holds=4),
]


def _model(layout: Layout) -> dict[str, dict[str, Any]]:
    return {
        "m": {
            "preload": True,
            "ctx_size": layout.ctx_size,
            "parallel": layout.parallel,
            "kv_unified": layout.kv_unified,
            "keep_context": True,
            "keep_conversations": True,
            "args": ["--fake-slots"],
        }
    }


def _first(i: int) -> list[dict[str, str]]:
    text = " ".join(f"{WORDS[(i + j) % len(WORDS)]}{i}" for j in range(FIRST_WORDS))
    return [{"role": "system", "content": f"Clerk {i}."}, {"role": "user", "content": text}]


async def _turn(gw: Gateway, messages: list[dict[str, str]]) -> dict[str, Any]:
    r = await gw.client.post(
        "/v1/chat/completions", json={"model": "m", "messages": messages, "max_tokens": 3}
    )
    assert r.status_code == 200, r.text
    answer: dict[str, Any] = r.json()
    messages.append({"role": "assistant", "content": answer["choices"][0]["message"]["content"]})
    return answer


def _counters(gw: Gateway) -> dict[str, int]:
    contexts = gw.model("m").contexts
    assert contexts is not None
    c = contexts.conversations
    return {"hits": c.hits, "misses": c.misses, "restores": c.restores, "warnings": c.warnings}


async def _slots(gw: Gateway) -> list[dict[str, Any]]:
    server = gw.model("m").server
    assert server is not None
    answer = await server.slots()
    assert isinstance(answer, list)
    return answer


@pytest.mark.parametrize("layout", LAYOUTS, ids=[layout.name for layout in LAYOUTS])
async def test_every_returning_turn_is_answered_from_its_state(serve: Serve, layout: Layout) -> None:
    async with serve(_model(layout)) as gw:
        conversations = [_first(i) for i in range(layout.conversations)]
        for messages in conversations:
            await _turn(gw, messages)
        held = [s for s in await _slots(gw) if s.get("n_prompt_tokens")]
        assert len(held) == layout.holds, held  # the cache holds fewer than were started
        if layout.shared:  # the shared cache ran full: the child emptied idle slots on its own
            assert "purging slot" in gw.child_log("m")
        returning = 0
        for round_ in range(2):
            for i, messages in enumerate(conversations):
                messages.append({"role": "user", "content": f"And {WORDS[i]} {round_}?"})
                answer = await _turn(gw, messages)
                returning += 1
                timings, prompt = answer["timings"], answer["usage"]["prompt_tokens"]
                # Its state was found or restored: only the new question and the last reply token
                # are computed, never the conversation.
                assert timings["prompt_n"] <= 8 and timings["cache_n"] == prompt - timings["prompt_n"], (
                    i,
                    round_,
                    timings,
                    _counters(gw),
                )
        c = _counters(gw)
        assert c["hits"] == returning and c["misses"] == 0 and c["warnings"] == 0, c
        # More conversations than the cache holds: some had to come back from disk.
        assert c["restores"] >= returning - layout.holds * 2, c
        row = next(m for m in (await gw.client.get("/api/models")).json()["models"] if m["name"] == "m")
        assert row["contexts"]["conversation_hits"] == returning
        assert row["contexts"]["conversation_off"] is None


@pytest.mark.parametrize("layout", [x for x in LAYOUTS if x.parallel > 1], ids=lambda x: x.name)
async def test_turns_at_once_are_counted_as_the_child_served_them(serve: Serve, layout: Layout) -> None:
    """Returning turns sent two at a time: a slot emptied for the other turn between the restore
    and the start of its own is possible in a shared cache; whatever happens, a turn the child
    did not reuse is a miss, never a hit, and it does not turn the tier off."""
    async with serve(_model(layout)) as gw:
        conversations = [_first(i) for i in range(layout.conversations)]
        for messages in conversations:
            await _turn(gw, messages)
        answers: list[dict[str, Any]] = []

        async def turn(i: int, messages: list[dict[str, str]]) -> None:
            messages.append({"role": "user", "content": f"And {WORDS[i]}?"})
            answers.append(await _turn(gw, messages))

        for pair in range(0, len(conversations) - 1, 2):
            async with anyio.create_task_group() as tg:
                for i in (pair, pair + 1):
                    tg.start_soon(turn, i, conversations[i])
        c = _counters(gw)
        reused = [a for a in answers if 2 * a["timings"]["cache_n"] >= a["usage"]["prompt_tokens"]]
        assert c["hits"] == len(reused) and c["misses"] == len(answers) - len(reused), (c, answers)
        contexts = gw.model("m").contexts
        assert contexts is not None and contexts.book.off is None


async def test_a_slot_without_a_count_is_emptied_when_a_restore_does_not_fit(serve: Serve) -> None:
    """A slot that never ran a task reports no ``n_prompt_tokens``, yet may hold what the start
    restored (``keep_context``'s planned-stop saves, restored before the first request): forge
    counts it as empty; when the restore then does not fit the shared cache, that slot is emptied
    and the restore tried once more."""
    layout = Layout("unified-2", kv_unified=True, parallel=2, ctx_size=1200, conversations=1, holds=1)
    async with serve(_model(layout)) as gw:
        a = _first(0)
        await _turn(gw, a)  # slot 0, saved
        server, plan = gw.model("m").server, gw.model("m").plan
        assert server is not None and plan is not None and plan.slot_save_dir is not None
        await server.slot_action(0, "erase")  # emptied behind forge's back (as a full cache does)
        (plan.slot_save_dir / "started.slot").write_text(json.dumps([f"w{i}" for i in range(700)]))
        await server.slot_action(1, "restore", "started.slot")  # as the start restores a slot
        assert [s.get("n_prompt_tokens") for s in await _slots(gw)] == [0, None]
        a.append({"role": "user", "content": "And apple?"})
        answer = await _turn(gw, a)
        assert answer["timings"]["prompt_n"] <= 8, answer["timings"]
        c = _counters(gw)
        assert c["hits"] == 1 and c["restores"] == 1 and c["warnings"] == 0, c
