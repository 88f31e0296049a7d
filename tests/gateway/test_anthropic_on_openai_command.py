"""Claude Code's API on a server of OpenAI chat only: `forge serve` translates ``/v1/messages``
for a ``backend = "command"`` model whose ``routes`` lack it, both ways, streamed and not.

The command is the FAKE llama-server (tests/support/fake_llama_server.py) with
``routes = ["/v1/chat/completions"]``, so forge never sends it ``/v1/messages``; its
``--fake-tool-calls`` answers a chat with tools with a FAKE tool call, streamed in pieces. The
real anthropic SDK is the client: text streamed and whole, a Claude-Code-shaped exchange (tools, a
``tool_use`` turn, a ``tool_result`` turn), the charge in ``/api/usage`` and the activity rows.
The last test runs the real llama-server as such a command (tool-less, streamed).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest

from tests.support.service import FAST, Service, running_service, wait_for, write_config

TOOLS: list[Any] = [
    {
        "name": "Read",
        "description": "Read a file",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
    }
]


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory, fake_bin: Path) -> Iterator[Service]:
    d = tmp_path_factory.mktemp("anthropic-on-openai")
    cmd = [str(fake_bin), "--host", "${HOST}", "--port", "${PORT}", "--fake-tool-calls"]
    config = write_config(
        d / "forge.toml",
        FAST
        + f"""
[models.oai]
backend = "command"
cmd = {cmd!r}
routes = ["/v1/chat/completions"]
gpu = "cpu"
preload = true
""".replace("'", '"'),
    )
    with running_service(config, d / "state", fake_bin) as s:
        yield s


def _client(svc: Service, closing: ExitStack) -> anthropic.Anthropic:
    return closing.enter_context(anthropic.Anthropic(base_url=svc.url, api_key="none", max_retries=0))


def _usage(svc: Service, requests: int) -> dict[str, Any] | None:
    with svc.client() as c:
        rows = c.get("/api/usage", params={"by": "model", "since": "1h"}).json()["usage"]
    found = next((r for r in rows if r["model"] == "oai"), None)
    return found if found is not None and found["requests"] >= requests else None


def test_text_whole_and_streamed_and_charged(svc: Service, closing: ExitStack) -> None:
    client = _client(svc, closing)
    before = (_usage(svc, 0) or {"requests": 0, "prompt_tokens": 0, "completion_tokens": 0}).copy()

    whole = client.messages.create(model="oai", max_tokens=16, messages=[{"role": "user", "content": "Hi"}])
    assert whole.type == "message" and whole.role == "assistant" and whole.model == "oai"
    assert [b.type for b in whole.content] == ["text"] and whole.content[0].text == "tok tok tok"  # type: ignore[union-attr]
    assert whole.stop_reason == "max_tokens"
    assert (whole.usage.input_tokens, whole.usage.output_tokens) == (2, 3)

    with client.messages.stream(
        model="oai", max_tokens=16, system="Be brief.", messages=[{"role": "user", "content": "Hi"}]
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "tok0 tok1 tok2 "
    assert final.stop_reason == "max_tokens"
    # The FAKE's stream says its counts only at the end (llama-server's timings): message_delta.
    assert (final.usage.input_tokens, final.usage.output_tokens) == (2, 3)

    used = wait_for(lambda: _usage(svc, before["requests"] + 2), timeout=30, what="two more requests charged")
    assert used["prompt_tokens"] - before["prompt_tokens"] == 4, used
    assert used["completion_tokens"] - before["completion_tokens"] == 6, used
    with svc.client() as c:
        rows = c.get("/api/activity", params={"limit": 50}).json()["activity"]
    mine = [r for r in rows if r["model"] == "oai" and r["route"] == "/v1/messages"]
    assert len(mine) >= 2 and all(r["status"] == 200 and r["completion_tokens"] == 3 for r in mine), mine


def test_a_claude_code_exchange_with_tools(svc: Service, closing: ExitStack) -> None:
    client = _client(svc, closing)
    messages: list[Any] = [{"role": "user", "content": "Read a.txt"}]
    with client.messages.stream(
        model="oai", max_tokens=64, system="You are a coding agent.", tools=TOOLS, messages=messages
    ) as stream:
        call = stream.get_final_message()
    assert call.stop_reason == "tool_use"
    (block,) = call.content
    assert block.type == "tool_use" and block.name == "Read" and block.input == {"fake": "arg", "n": 1}

    whole = client.messages.create(model="oai", max_tokens=64, tools=TOOLS, messages=messages)
    assert whole.stop_reason == "tool_use" and whole.content[0].type == "tool_use"

    messages += [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in call.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": block.id, "content": "hello from a.txt"}],
        },
    ]
    with client.messages.stream(model="oai", max_tokens=64, tools=TOOLS, messages=messages) as stream:
        answer = stream.get_final_message()
    assert answer.stop_reason == "max_tokens" and answer.content[0].type == "text"


def test_count_tokens_is_a_400_saying_why(svc: Service) -> None:
    with httpx.Client(base_url=svc.url, timeout=30) as c:
        r = c.post(
            "/v1/messages/count_tokens",
            json={"model": "oai", "messages": [{"role": "user", "content": "Hi"}]},
        )
    assert r.status_code == 400
    error = r.json()
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert "cannot count tokens" in error["error"]["message"]


def test_the_real_llama_server_as_an_openai_only_command(
    tmp_path: Path,
    llama_server_bin: Path,
    llama_server_flags: tuple[str, ...],
    tiny_gguf: Path,
    closing: ExitStack,
) -> None:
    cmd = [str(llama_server_bin), "--host", "${HOST}", "--port", "${PORT}", "-m", "${MODEL}"]
    cmd += ["-c", "512", "-np", "1", "--no-webui", *llama_server_flags]
    config = write_config(
        tmp_path / "forge.toml",
        FAST
        + f"""
[models.real]
backend = "command"
path = "{tiny_gguf}"
cmd = {cmd!r}
routes = ["/v1/chat/completions"]
gpu = "cpu"
preload = true
""".replace("'", '"'),
    )
    with running_service(config, tmp_path / "state", llama_server_bin) as s:
        client = closing.enter_context(anthropic.Anthropic(base_url=s.url, api_key="none", max_retries=0))
        with client.messages.stream(
            model="real", max_tokens=8, messages=[{"role": "user", "content": "Hi"}]
        ) as stream:
            text = "".join(stream.text_stream)
            final = stream.get_final_message()
        assert final.stop_reason in ("max_tokens", "end_turn")
        assert final.usage.input_tokens > 0 and final.usage.output_tokens > 0
        assert text or final.usage.output_tokens
