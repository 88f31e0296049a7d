"""TextModel over a real llama-server: streaming, usage, cancellation, crashes, errors."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import anyio
import httpx
import psutil
import pytest

from rocmforge_supervisor import (
    ContextExceeded,
    Message,
    ModelCrashed,
    TextModel,
    aload_model,
    load_model,
)
from rocmforge_supervisor.config import ForgeSettings


def _busy_slots(base_url: str, api_key: str) -> int:
    r = httpx.get(f"{base_url}/slots", headers={"Authorization": f"Bearer {api_key}"}, timeout=5)
    r.raise_for_status()
    return sum(1 for s in r.json() if s.get("is_processing"))


def _wait_for(cond: object, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():  # type: ignore[operator]
            return True
        time.sleep(0.02)
    return False


def test_generate_and_chat_stream_sync(tiny_gguf: Path, state_settings: ForgeSettings) -> None:
    with load_model(tiny_gguf, settings=state_settings, ctx_size=1024, gpu="cpu") as model:
        assert model.pid is not None and psutil.pid_exists(model.pid)
        tokens = list(model.generate("Once upon a time", max_tokens=8))
        assert tokens[-1].finish_reason == "length"
        assert all(t.finish_reason is None for t in tokens[:-1])
        assert "".join(t.text for t in tokens).strip()
        assert model.last_usage is not None and model.last_usage.completion_tokens == 8
        assert model.last_timings is not None and model.last_timings["predicted_n"] == 8
        assert model.err() is None

        reply = list(model.chat([Message("user", "Hi!")], max_tokens=5))
        assert reply[-1].finish_reason == "length"
        assert model.last_usage is not None and model.last_usage.completion_tokens == 5
        pid = model.pid
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    model.close()  # idempotent


@pytest.mark.anyio
async def test_generate_and_chat_stream_async(tiny_gguf: Path, state_settings: ForgeSettings) -> None:
    async with await aload_model(tiny_gguf, settings=state_settings, ctx_size=1024, gpu="cpu") as model:
        texts = [t.text async for t in model.agenerate("The", max_tokens=6)]
        assert len("".join(texts)) > 0
        assert model.last_usage is not None and model.last_usage.completion_tokens == 6
        reply = [t async for t in model.achat([{"role": "user", "content": "Hello"}], max_tokens=4)]
        assert reply[-1].finish_reason == "length"


def test_breaking_out_frees_the_slot(tiny_gguf: Path, state_settings: ForgeSettings) -> None:
    with load_model(tiny_gguf, settings=state_settings, ctx_size=2048, parallel=1, gpu="cpu") as model:
        stream = model.generate("Count:", max_tokens=1500)
        for i, _tok in enumerate(stream):
            if i == 3:
                break
        stream.close()  # what CPython's refcounting does right after `break`
        assert _wait_for(lambda: _busy_slots(model.base_url, model.server.api_key) == 0, timeout=5)
        # The slot is reusable at once: a new request completes.
        assert list(model.generate("Next", max_tokens=3))[-1].finish_reason == "length"
        assert model.last_usage is not None and model.last_usage.completion_tokens == 3


def test_sigkill_mid_stream_raises_model_crashed(gemma_path: Path, state_settings: ForgeSettings) -> None:
    # The real gemma model: slow enough that the kill lands mid-stream.
    with load_model(gemma_path, settings=state_settings, ctx_size=2048, gpu="cpu") as model:
        pid = model.pid
        assert pid is not None
        got = []
        with pytest.raises(ModelCrashed) as info:
            for tok in model.generate("Go", max_tokens=1500):
                got.append(tok)
                if len(got) == 2:
                    os.kill(pid, signal.SIGKILL)  # fault injection
        assert got, "tokens arrived before the crash"
        assert info.value.returncode == -signal.SIGKILL
        assert model.err() is info.value


def test_context_exceeded_is_typed(tiny_gguf: Path, state_settings: ForgeSettings) -> None:
    with load_model(tiny_gguf, settings=state_settings, ctx_size=256, parallel=1, gpu="cpu") as model:
        with pytest.raises(ContextExceeded) as info:
            list(model.generate("the time " * 400, max_tokens=4))
        assert info.value.n_ctx == 256
        assert info.value.n_prompt_tokens is not None and info.value.n_prompt_tokens > 256
        assert model.err() is info.value
        # The model still works afterwards.
        assert list(model.generate("ok", max_tokens=2))


def test_connect_to_a_running_server(tiny_gguf: Path, state_settings: ForgeSettings) -> None:
    with load_model(tiny_gguf, settings=state_settings, ctx_size=512, gpu="cpu", alias="tiny") as owned:
        remote = TextModel.connect(owned.openai_base_url, model="tiny", api_key=owned.server.api_key)
        with remote:
            assert remote.pid is None
            assert [t for t in remote.generate("x", max_tokens=3) if t.text]
            assert remote.last_usage is not None and remote.last_usage.completion_tokens == 3


def test_idle_connection_closed_by_server_is_invisible(
    tiny_gguf: Path, state_settings: ForgeSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """llama-server drops idle keep-alive connections after 5 s; a request sent on such a
    connection must be retried on a fresh one, never surface as an error."""
    import rocmforge_supervisor.client._transport as transport

    monkeypatch.setattr(transport, "KEEPALIVE_EXPIRY", 60.0)  # keep the stale connection in the pool
    with load_model(tiny_gguf, settings=state_settings, ctx_size=512, gpu="cpu") as model:
        assert list(model.generate("a", max_tokens=1))
        deadline = time.monotonic() + 5.3  # just past the server's keep-alive timeout
        while time.monotonic() < deadline:
            time.sleep(0.05)
        for _ in range(3):
            assert list(model.generate("b", max_tokens=1))


@pytest.mark.anyio
async def test_async_cancel_during_load_leaves_no_child(
    gemma_path: Path, state_settings: ForgeSettings
) -> None:
    with anyio.move_on_after(0.3) as scope:
        await aload_model(gemma_path, settings=state_settings, gpu="cpu")
    assert scope.cancelled_caught
    # no_orphans (autouse) checks that no llama-server child is left.


def test_gguf_without_template_gets_its_architectures_format(
    gemma_path: Path, state_settings: ForgeSettings
) -> None:
    """The embedded gemma GGUF has no chat template: llama-server alone would use ChatML and the
    model would answer with ChatML markers; forge passes llama.cpp's built-in `gemma` format."""
    from rocmforge_supervisor._argv import fallback_chat_template_args

    with load_model(gemma_path, settings=state_settings, ctx_size=1024, gpu="cpu") as model:
        assert list(model.server.spec.extra_args[:3]) == ["--no-jinja", "--chat-template", "gemma"]
        r = httpx.post(
            f"{model.base_url}/apply-template",
            json={"messages": [{"role": "user", "content": "Name a color."}]},
            headers={"Authorization": f"Bearer {model.server.api_key}"},
            timeout=10,
        )
        assert r.json()["prompt"] == "<start_of_turn>user\nName a color.<end_of_turn>\n<start_of_turn>model\n"
        reply = "".join(t.text for t in model.chat([Message("user", "Name a color.")], max_tokens=24))
        assert "<|im_end|>" not in reply and "<|im_start|>" not in reply
    info = model.plan.info
    assert (
        fallback_chat_template_args(info.has_chat_template, info.architecture, ["--chat-template", "chatml"])
        == []
    )  # the user's choice wins
