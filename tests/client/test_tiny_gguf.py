"""The tiny test GGUF: deterministic, small, and really served by the pinned llama-server."""

from __future__ import annotations

import os
import queue
import re
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import gguf
import httpx
import pytest

from rocmforge_supervisor._errors import ServerError
from rocmforge_supervisor.client._sse import iter_chunks
from tests.support.tiny_gguf import TINY_N_CTX, TINY_N_EMBD, write_tiny_gguf

_LISTENING = re.compile(r"listening on (http://\S+)")


def test_same_seed_same_bytes_other_seed_other_weights(tmp_path: Path) -> None:
    a = write_tiny_gguf(tmp_path / "a.gguf").read_bytes()
    assert write_tiny_gguf(tmp_path / "b.gguf").read_bytes() == a
    assert write_tiny_gguf(tmp_path / "c.gguf", seed=1).read_bytes() != a
    assert len(a) < 4 << 20


def test_metadata_is_a_gqa_llama_with_a_real_vocab(tiny_gguf: Path) -> None:
    reader = gguf.GGUFReader(tiny_gguf)

    def field(key: str) -> object:
        return reader.fields[key].contents()

    assert field("general.architecture") == "llama"
    assert field("llama.context_length") == TINY_N_CTX
    assert field("llama.embedding_length") == TINY_N_EMBD
    assert (field("llama.attention.head_count"), field("llama.attention.head_count_kv")) == (4, 2)
    assert field("llama.block_count") == 2
    tokens = field("tokenizer.ggml.tokens")
    assert isinstance(tokens, list)
    assert tokens[:3] == ["<unk>", "<s>", "</s>"] and "<0x0A>" in tokens and "\u2581the" in tokens
    assert "<|im_start|>" in str(field("tokenizer.chat_template"))


@contextmanager
def _serve(server: Path, model: Path, tmp: Path, deadline_s: float = 60.0) -> Iterator[tuple[str, float]]:
    """Run llama-server on a free port; yield (base URL, seconds from spawn to /health 200)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLAMA_", "HF_"))}
    env["XDG_CONFIG_HOME"] = str(tmp)  # no stray ~/.config/llama.cpp/config.ini
    cmd = [str(server), "-m", str(model), "--host", "127.0.0.1", "--port", "0", "-c", "512", "-np", "1"]
    lines: queue.Queue[str | None] = queue.Queue()
    log: list[str] = []
    with httpx.Client(timeout=5) as health:  # made first: its set-up is not the server's load time
        started = time.monotonic()
        proc = subprocess.Popen(
            cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )

        def pump() -> None:  # keep draining stderr so the child never blocks on a full pipe
            assert proc.stderr is not None
            for raw in proc.stderr:
                lines.put(raw.decode("utf-8", "replace"))
            lines.put(None)

        pumper = threading.Thread(target=pump, daemon=True)
        pumper.start()
        try:
            end = started + deadline_s
            url = None
            while url is None:
                try:
                    line = lines.get(timeout=max(0.01, end - time.monotonic()))
                except queue.Empty:
                    pytest.fail(f"llama-server did not listen within {deadline_s} s:\n{''.join(log[-20:])}")
                if line is None:
                    pytest.fail(f"llama-server exited {proc.wait()} before listening:\n{''.join(log[-20:])}")
                log.append(line)
                if m := _LISTENING.search(line):
                    url = m.group(1)
            while (resp := health.get(f"{url}/health")).status_code != 200:
                assert time.monotonic() < end, f"/health still {resp.status_code}"
            yield url, time.monotonic() - started
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
            pumper.join(timeout=10)  # it ends at EOF, now that the child is gone
            if proc.stderr is not None:
                proc.stderr.close()


@pytest.mark.timeout(90)
def test_llama_server_serves_the_tiny_model(
    llama_server_bin: Path, tiny_gguf: Path, tmp_path: Path, record_property: Callable[[str, object], None]
) -> None:
    with _serve(llama_server_bin, tiny_gguf, tmp_path) as (url, load_s), httpx.Client(timeout=30) as client:
        record_property("tiny_load_s", round(load_s, 3))
        props = client.get(f"{url}/props").json()
        assert "<|im_start|>" in props["chat_template"]

        body = {"prompt": "the world", "max_tokens": 16, "stream": True, "seed": 1}
        with client.stream("POST", f"{url}/v1/completions", json=body) as resp:
            assert resp.status_code == 200
            chunks = list(iter_chunks(resp.iter_bytes()))
        # Word pieces only, never EOS: every generation runs to max_tokens, one chunk per token.
        assert chunks[-1]["usage"]["completion_tokens"] == 16 == len(chunks) - 1
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
        assert "".join(c["choices"][0]["text"] for c in chunks).strip()

        chat = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 8, "stream": True}
        with client.stream("POST", f"{url}/v1/chat/completions", json=chat) as resp:
            assert resp.status_code == 200
            chunks = list(iter_chunks(resp.iter_bytes()))
        assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
        assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks).strip()


@pytest.mark.timeout(90)
def test_invalid_utf8_model_fails_chat_streams_mid_stream(llama_server_bin: Path, tmp_path: Path) -> None:
    model = write_tiny_gguf(tmp_path / "bad.gguf", invalid_utf8=True)
    with _serve(llama_server_bin, model, tmp_path) as (url, _), httpx.Client(timeout=30) as client:
        chat = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 8, "stream": True}
        seen: list[dict[str, Any]] = []
        with client.stream("POST", f"{url}/v1/chat/completions", json=chat) as resp:
            assert resp.status_code == 200  # the headers went out before the failure
            with pytest.raises(ServerError, match="does not match the expected") as info:
                seen.extend(iter_chunks(resp.iter_bytes()))
        assert info.value.status_code == 500 and info.value.error_type == "server_error"
        assert [c["choices"][0]["delta"].get("role") for c in seen] == ["assistant"]
