"""Anthropic streams are charged their whole prompt, however the gateway reads them.

Through `forge serve` on the real llama-server (the tiny random-weight GGUF: its tokens come
faster than the gateway reads them, and every generation runs to its length): six
``/v1/messages`` streams of 40 tokens at once through the anthropic SDK. The prompt is said only
in each stream's first event (``message_start``); the gateway reads many events of a stream in
one block, longer than the tail it keeps for the last usage, and the start was dropped before it
was read (``/api/usage`` charged some of the six no prompt at all). The byte-level cases are
tests/service/test_anthropic_usage.py.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import anthropic
import pytest

from tests.support.service import Service, model_section, running_service, wait_for, write_config

STREAMS = 6
TOKENS = 40


@pytest.fixture(scope="module")
def svc(
    tmp_path_factory: pytest.TempPathFactory, llama_server_bin: Path, tiny_gguf: Path
) -> Iterator[Service]:
    d = tmp_path_factory.mktemp("anthropic-usage")
    config = write_config(
        d / "forge.toml", model_section("tiny", tiny_gguf, ctx_size=2048, parallel=3, preload=True)
    )
    with running_service(config, d / "state", llama_server_bin) as s:
        yield s


def _stream(client: anthropic.Anthropic, n: int, starts: list[int], ends: list[int]) -> None:
    with client.messages.stream(
        model="tiny",
        max_tokens=TOKENS,
        messages=[{"role": "user", "content": f"Story number {n}: tell me about the sea."}],
    ) as stream:
        for event in stream:
            if event.type == "message_start":
                usage = event.message.usage
                starts.append(usage.input_tokens + (usage.cache_read_input_tokens or 0))
            elif event.type == "message_delta":
                ends.append(event.usage.output_tokens)


def _usage(svc: Service) -> dict[str, Any] | None:
    with svc.client() as c:
        rows = c.get("/api/usage", params={"by": "model", "since": "1h"}).json()["usage"]
    found = next((r for r in rows if r["model"] == "tiny"), None)
    return found if found is not None and found["requests"] >= STREAMS else None


def test_six_anthropic_streams_at_once_are_charged_every_prompt(svc: Service, closing: ExitStack) -> None:
    client = closing.enter_context(anthropic.Anthropic(base_url=svc.url, api_key="none", max_retries=0))
    starts: list[int] = []
    ends: list[int] = []
    errors: list[BaseException] = []

    def run(n: int) -> None:
        try:
            _stream(client, n, starts, ends)
        except BaseException as exc:  # reported by the test, not lost in the thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(n,)) for n in range(STREAMS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=180)
    assert not errors, errors
    assert len(starts) == STREAMS and all(starts), starts
    assert ends == [TOKENS] * STREAMS, ends
    usage = wait_for(lambda: _usage(svc), timeout=30, what="the six rows in /api/usage")
    assert usage["requests"] == STREAMS, usage
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (sum(starts), sum(ends)), usage
    with svc.client() as c:
        rows = c.get("/api/activity", params={"limit": 50}).json()["activity"]
    assert all(r["prompt_tokens"] for r in rows if r["model"] == "tiny"), rows
