"""``keep_context`` through a real `forge serve` and the real llama-server on SmolLM2: a model's
KV-cache slots saved at a planned stop (unload, shutdown) and restored into its next child before
the first request, so a resumed conversation skips its prefill — and every way that must not
happen (another model file, another context size, a truncated or corrupt file, the budget, off).

Whether a prefix was restored is read from llama-server's own answer: ``timings.prompt_n`` (the
prompt tokens it computed) and ``usage.prompt_tokens_details.cached_tokens``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from tests.support.service import FORGE, Service, model_section, running_service, wait_for, write_config

#: ~700 prompt tokens for the prefill measurements; short prompts where only a save is needed.
LONG_WORDS = 300
SHORT_WORDS = 40


def _conversation(topic: str, words: int) -> list[dict[str, str]]:
    text = " ".join(f"{topic}{i % 97} is item {i}." for i in range(words // 4))
    return [
        # The topic first: two conversations share almost no prefix, so each takes its own slot.
        {"role": "system", "content": f"{topic.title()} expert. You are terse."},
        {"role": "user", "content": f"Remember this list: {text} Which {topic} came first?"},
    ]


def _chat(svc: Service, model: str, messages: list[dict[str, str]]) -> dict[str, Any]:
    with svc.client() as c:
        r = c.post(
            "/v1/chat/completions",
            json={"model": model, "messages": messages, "max_tokens": 2, "temperature": 0},
            timeout=300,
        )
    assert r.status_code == 200, r.text
    answer: dict[str, Any] = r.json()
    return answer


def _computed(answer: dict[str, Any]) -> int:
    """Prompt tokens the child computed for this request (the rest came from its KV cache)."""
    return int(answer["timings"]["prompt_n"])


def _cached(answer: dict[str, Any]) -> int:
    return int(answer["usage"]["prompt_tokens_details"]["cached_tokens"])


def _unload(svc: Service, model: str, query: str = "") -> httpx.Response:
    with svc.client() as c:
        return c.post(f"/api/models/{model}/unload{query}", timeout=120)


def _forge(svc: Service, *args: str) -> subprocess.CompletedProcess[str]:
    """The CLI against this service (found through its state dir), on a wide terminal."""
    env = dict(os.environ, FORGE_STATE_DIR=str(svc.state_dir), COLUMNS="250", NO_COLOR="1")
    return subprocess.run([*FORGE, *args], capture_output=True, text=True, env=env, timeout=120)


def _events(svc: Service, until: Any, timeout: float = 30.0) -> list[dict[str, Any]]:
    """The event history (``/api/events?replay=1``) read until ``until(events)`` holds."""
    seen: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    with (
        httpx.Client(base_url=svc.url, headers=svc.headers, timeout=timeout) as c,
        c.stream("GET", "/api/events?replay=1") as r,
    ):
        for line in r.iter_lines():
            if line.startswith("data: "):
                seen.append(json.loads(line[6:]))
                if until(seen):
                    return seen
            if time.monotonic() > deadline:
                break
    raise AssertionError(f"events never matched; seen: {[(e['model'], e['kind'], e['data']) for e in seen]}")


def _kinds(events: list[dict[str, Any]], kind: str, model: str | None = None) -> list[dict[str, Any]]:
    return [e for e in events if e["kind"] == kind and (model is None or e["model"] == model)]


def _files(d: Path) -> list[Path]:
    return sorted(p for p in d.rglob("*") if p.is_file()) if d.exists() else []


def _config(tmp_path: Path, models: str, server: str = "") -> Path:
    return write_config(
        tmp_path / "forge.toml",
        f"[server]\n{server}\n[supervisor]\nhealth_interval = 30\nstop_timeout = 20\n{models}",
    )


def _stop(svc: Service) -> None:
    """SIGTERM, as systemd stops it: a planned stop, which saves."""
    svc.proc.send_signal(signal.SIGTERM)
    assert svc.proc.wait(timeout=90) == 0, svc.stderr_text()[-3000:]


def test_unload_saves_and_the_next_load_restores(
    tmp_path: Path, smollm2_path: Path, llama_server_bin: Path
) -> None:
    """The same long request after `unload` computes a few tokens instead of the whole prompt; the
    files are 0700/0600 with a manifest; `forge ps` and /metrics show them; `forge unload --forget`
    deletes them; a model without keep_context writes nothing and its child has no --slot-save-path."""
    models = model_section("kept", smollm2_path, ctx_size=4096, parallel=1, keep_context=True)
    models += model_section("plain", smollm2_path, ctx_size=1024, parallel=1)
    cfg = _config(tmp_path, models)
    ctx_dir = tmp_path / "state" / "contexts"
    long = _conversation("apple", LONG_WORDS)
    with running_service(cfg, tmp_path / "state", llama_server_bin) as svc:
        t0 = time.monotonic()
        cold = _chat(svc, "kept", long)
        cold_s = time.monotonic() - t0
        n_prompt = int(cold["usage"]["prompt_tokens"])
        assert n_prompt > 500 and _computed(cold) > 500, cold

        t0 = time.monotonic()
        assert _unload(svc, "kept").status_code == 200
        unload_s = time.monotonic() - t0
        saved = _kinds(_events(svc, lambda ev: _kinds(ev, "context_saved")), "context_saved")
        assert saved[0]["data"]["tokens"] >= n_prompt and saved[0]["data"]["slot"] == 0

        # On disk: 0700 directories, 0600 files, a data file and its manifest.
        files = _files(ctx_dir)
        assert [p.suffix for p in files] == [".json", ".slot"], files
        for d in (ctx_dir, files[0].parent):
            assert stat.S_IMODE(d.stat().st_mode) == 0o700
        assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in files)
        manifest = json.loads(files[0].read_text())
        assert manifest["model"] == "kept" and manifest["tokens"] >= n_prompt
        assert manifest["bytes"] == files[1].stat().st_size
        assert manifest["key"]["model"]["path"] == str(smollm2_path.resolve())
        assert manifest["key"]["layout"]["ctx_size"] == 4096
        row = svc.model("kept")
        assert row["keep_context"] and row["contexts"]["count"] == 1
        assert row["contexts"]["tokens"] >= n_prompt and row["contexts"]["bytes"] == files[1].stat().st_size

        t0 = time.monotonic()
        warm = _chat(svc, "kept", long)
        warm_s = time.monotonic() - t0
        assert _computed(warm) <= 4 and _cached(warm) >= n_prompt - 4, warm
        assert warm["choices"][0]["message"]["content"] == cold["choices"][0]["message"]["content"]
        restored = _kinds(_events(svc, lambda ev: _kinds(ev, "context_restored")), "context_restored")
        assert restored[0]["data"]["tokens"] >= n_prompt
        with svc.client() as c:
            metrics = c.get("/metrics").text
        assert 'forge_context_restores_total{model="kept"} 1.0' in metrics, metrics
        assert 'forge_context_saves_total{model="kept"} 1.0' in metrics
        assert 'forge_context_stored{model="kept"} 1.0' in metrics
        print(
            f"\ncold {cold_s:.2f} s ({n_prompt} tokens), unload+save {unload_s:.2f} s, restored {warm_s:.2f} s"
        )

        # keep_context off: nothing written, no --slot-save-path on its child.
        _chat(svc, "plain", _conversation("pear", SHORT_WORDS))
        child = psutil.Process(svc.model("plain")["pid"])
        assert "--slot-save-path" not in child.cmdline()
        assert _unload(svc, "plain").status_code == 200
        assert not (ctx_dir / "plain").exists()
        assert svc.model("plain")["contexts"]["count"] == 0

        # --forget: not a boolean → 400 naming it; true → the saved contexts are gone, none saved.
        r = _unload(svc, "kept", "?forget=maybe")
        assert r.status_code == 400 and "forget" in r.json()["error"]["message"], r.text
        assert svc.model("kept")["state"] == "ready"
        ps = _forge(svc, "ps")
        assert ps.returncode == 0 and "contexts" in ps.stdout, ps
        (row_line,) = [line for line in ps.stdout.splitlines() if "kept" in line]
        assert " 1 (" in row_line and " tok, " in row_line, ps.stdout
        r = _forge(svc, "unload", "kept", "--forget")
        assert (
            r.returncode == 0
            and r.stderr.strip() == "kept: stopped; its saved context was deleted (--forget)"
        ), r
        assert _files(ctx_dir) == [] and svc.model("kept")["contexts"]["count"] == 0
        assert len(_kinds(_events(svc, lambda ev: _kinds(ev, "context_deleted")), "context_saved")) == 1


def test_forge_unload_says_what_became_of_the_context(
    tmp_path: Path, smollm2_path: Path, llama_server_bin: Path
) -> None:
    """`forge unload` of a keep_context model said only "kept: stopped" (issue 37): it says what it
    saved for the next load, that there was nothing to save, or that --forget deleted it."""
    models = model_section("kept", smollm2_path, ctx_size=1024, parallel=1, keep_context=True, preload=True)
    with running_service(_config(tmp_path, models), tmp_path / "state", llama_server_bin) as svc:
        wait_for(lambda: svc.model("kept")["state"] == "ready", timeout=120, what="kept ready")
        r = _forge(svc, "unload", "kept")
        assert (
            r.returncode == 0
            and r.stderr.strip() == "kept: stopped; no context to save (its slots held none)"
        ), r
        assert _forge(svc, "load", "kept").returncode == 0
        _chat(svc, "kept", _conversation("plum", SHORT_WORDS))
        r = _forge(svc, "unload", "kept")
        tokens = svc.model("kept")["contexts"]["tokens"]
        assert r.returncode == 0 and tokens > 0, r
        line = r.stderr.strip()
        assert line.startswith(f"kept: stopped; its context was saved (1 slot, {tokens} tokens, "), line
        assert line.endswith("): the next load restores it"), line
        r = _forge(svc, "unload", "kept", "--forget")  # already stopped: the saved context goes
        assert r.stderr.strip() == "kept: stopped; its saved context was deleted (--forget)", r


def test_two_conversations_come_back_after_a_serve_restart(
    tmp_path: Path, smollm2_path: Path, llama_server_bin: Path
) -> None:
    """parallel = 2: both slots are saved at SIGTERM and both come back in the next `forge serve`."""
    models = model_section("kept", smollm2_path, ctx_size=4096, parallel=2, keep_context=True)
    cfg = _config(tmp_path, models)
    a, b = _conversation("apple", LONG_WORDS // 2), _conversation("violin", LONG_WORDS // 2)
    with running_service(cfg, tmp_path / "state", llama_server_bin) as svc:
        first = [_chat(svc, "kept", a), _chat(svc, "kept", b)]
        assert all(_computed(x) > 250 for x in first), first
        _stop(svc)
    stderr = (tmp_path / "state" / "serve.stderr").read_text()
    assert stderr.count("saved slot") == 2, stderr[-3000:]
    with running_service(cfg, tmp_path / "state", llama_server_bin) as svc:
        again = [_chat(svc, "kept", b), _chat(svc, "kept", a)]
        for before, after in zip(reversed(first), again, strict=True):
            assert _computed(after) <= 4, after
            assert _cached(after) >= int(before["usage"]["prompt_tokens"]) - 4
        assert (
            len(_kinds(_events(svc, lambda ev: len(_kinds(ev, "context_restored")) >= 2), "context_restored"))
            == 2
        )


def _save_short(tmp_path: Path, cfg: Path, llama_server_bin: Path, topic: str = "apple") -> list[Path]:
    """One `forge serve` that answers a short request on ``kept`` and stops (saving it)."""
    with running_service(cfg, tmp_path / "state", llama_server_bin) as svc:
        _chat(svc, "kept", _conversation(topic, SHORT_WORDS))
        _stop(svc)
    files = _files(tmp_path / "state" / "contexts")
    assert len(files) == 2, files
    return files


@pytest.mark.parametrize("change", ["model_file", "ctx_size"])
def test_a_save_for_another_child_is_deleted_not_loaded(
    change: str, tmp_path: Path, smollm2_path: Path, llama_server_bin: Path
) -> None:
    """The model file replaced (same bytes, a new file) or ctx_size changed: the next start deletes
    the save with an event naming why, and the request is computed cold."""
    model = tmp_path / "m.gguf"
    shutil.copyfile(smollm2_path, model)
    cfg = _config(tmp_path, model_section("kept", model, ctx_size=2048, keep_context=True))
    _save_short(tmp_path, cfg, llama_server_bin)
    if change == "model_file":
        fresh = tmp_path / "m2.gguf"
        shutil.copyfile(smollm2_path, fresh)
        os.utime(fresh, ns=(time.time_ns(), time.time_ns() + 10**9))
        fresh.replace(model)
        why = "another model file"
    else:
        cfg = _config(tmp_path, model_section("kept", model, ctx_size=3072, keep_context=True))
        why = "another KV layout"
    with running_service(cfg, tmp_path / "state", llama_server_bin) as svc:
        answer = _chat(svc, "kept", _conversation("apple", SHORT_WORDS))
        assert _computed(answer) > 20, answer
        events = _events(svc, lambda ev: _kinds(ev, "context_deleted"))
        deleted = _kinds(events, "context_deleted")
        assert why in deleted[0]["data"]["reason"], deleted
        assert not _kinds(events, "context_restored")
        assert svc.model("kept")["contexts"]["count"] == 0
        assert _files(tmp_path / "state" / "contexts") == []


def test_truncated_or_corrupt_saves_start_cold_with_a_warning(
    tmp_path: Path, smollm2_path: Path, llama_server_bin: Path
) -> None:
    """One save truncated, one with a broken header: the load succeeds cold, each is a warning
    event, and both are deleted."""
    cfg = _config(tmp_path, model_section("kept", smollm2_path, ctx_size=2048, parallel=2, keep_context=True))
    with running_service(cfg, tmp_path / "state", llama_server_bin) as svc:
        _chat(svc, "kept", _conversation("apple", SHORT_WORDS))
        _chat(svc, "kept", _conversation("violin", SHORT_WORDS))
        _stop(svc)
    slots = [p for p in _files(tmp_path / "state" / "contexts") if p.suffix == ".slot"]
    assert len(slots) == 2, slots
    with slots[0].open("r+b") as f:
        f.truncate(slots[0].stat().st_size // 2)
    with slots[1].open("r+b") as f:
        f.write(b"\0" * 16)  # the state file's magic and version
    with running_service(cfg, tmp_path / "state", llama_server_bin) as svc:
        answer = _chat(svc, "kept", _conversation("apple", SHORT_WORDS))
        assert _computed(answer) > 20, answer
        events = _events(svc, lambda ev: len(_kinds(ev, "context_warning")) >= 2)
        messages = [e["data"]["message"] for e in _kinds(events, "context_warning")]
        assert any("truncated" in m for m in messages), messages
        assert any("restore" in m for m in messages), messages
        assert svc.model("kept")["state"] == "ready"
        assert _files(tmp_path / "state" / "contexts") == []


def test_the_budget_removes_the_least_recently_used(
    tmp_path: Path, smollm2_path: Path, llama_server_bin: Path
) -> None:
    """Two models' saves where the budget holds one and a half: the next save removes the one used
    least recently (with an event), not the newer one."""
    models = model_section("kept", smollm2_path, ctx_size=2048, keep_context=True)
    models += model_section("other", smollm2_path, ctx_size=2048, keep_context=True)
    cfg = _config(tmp_path, models)
    with running_service(cfg, tmp_path / "state", llama_server_bin) as svc:
        _chat(svc, "other", _conversation("violin", SHORT_WORDS))
        _chat(svc, "kept", _conversation("apple", SHORT_WORDS))
        _stop(svc)
    sizes = [p.stat().st_size for p in _files(tmp_path / "state" / "contexts") if p.suffix == ".slot"]
    assert len(sizes) == 2 and abs(sizes[0] - sizes[1]) < max(sizes) // 4, sizes
    cfg = _config(tmp_path, models, server=f"context_max_bytes = {max(sizes) * 3 // 2}")
    with running_service(cfg, tmp_path / "state", llama_server_bin) as svc:
        # "other" is restored (used) first, "kept" after it: "other" is the least recently used.
        _chat(svc, "other", _conversation("violin", SHORT_WORDS))
        _chat(svc, "kept", _conversation("apple", SHORT_WORDS))
        assert _unload(svc, "kept").status_code == 200
        events = _events(
            svc, lambda ev: any("context_max_bytes" in str(e["data"]) for e in _kinds(ev, "context_deleted"))
        )
        deleted = [(e["model"], e["data"]["reason"]) for e in _kinds(events, "context_deleted")]
        # Its own older save is replaced by the new one; then the budget takes "other"'s.
        assert [m for m, why in deleted if "context_max_bytes" in why] == ["other"], deleted
        assert ("kept", "replaced by a newer save") in deleted
        rows = svc.models()
        assert rows["kept"]["contexts"]["count"] == 1 and rows["other"]["contexts"]["count"] == 0


def test_an_unusable_context_dir_is_a_warning_and_a_normal_load(
    tmp_path: Path, smollm2_path: Path, llama_server_bin: Path
) -> None:
    """``context_dir`` is a file: the model loads and answers without keeping context, and says so."""
    (tmp_path / "not-a-dir").write_text("")
    cfg = _config(
        tmp_path,
        model_section("kept", smollm2_path, ctx_size=2048, keep_context=True),
        server=f'context_dir = "{tmp_path / "not-a-dir" / "contexts"}"',
    )
    with running_service(cfg, tmp_path / "state", llama_server_bin) as svc:
        _chat(svc, "kept", _conversation("apple", SHORT_WORDS))
        assert "--slot-save-path" not in psutil.Process(svc.model("kept")["pid"]).cmdline()
        assert _unload(svc, "kept").status_code == 200
        events = _events(svc, lambda ev: _kinds(ev, "context_warning"))
        assert "context is not kept" in _kinds(events, "context_warning")[0]["data"]["message"]
        assert svc.model("kept")["state"] == "stopped" and not _kinds(events, "context_saved")


def test_a_restarting_reload_and_the_ttl_keep_the_context(
    tmp_path: Path, smollm2_path: Path, llama_server_bin: Path
) -> None:
    """A reload that restarts the child (new args): the old child saves its slots and keeps
    serving, the new one restores them before its first request (start-new-first stays). Then
    the ttl's unload saves too."""
    convo = _conversation("apple", SHORT_WORDS * 3)
    section = model_section("kept", smollm2_path, ctx_size=2048, parallel=1, keep_context=True)
    cfg = _config(tmp_path, section)
    with running_service(cfg, tmp_path / "state", llama_server_bin) as svc:
        cold = _chat(svc, "kept", convo)
        assert _computed(cold) > 60, cold
        old_pid = svc.model("kept")["pid"]
        _config(tmp_path, section + 'args = ["--temp", "0.5"]\nttl = 2\n')
        with svc.client() as c:
            summary = c.post("/api/reload", timeout=120).json()
        assert summary["changed"] == ["kept"], summary
        warm = _chat(svc, "kept", convo)
        assert svc.model("kept")["pid"] != old_pid
        assert _computed(warm) <= 4 and _cached(warm) >= int(cold["usage"]["prompt_tokens"]) - 4, warm
        # Idle for its ttl: unloaded, and saved on the way.
        events = _events(
            svc,
            lambda ev: (
                [e["kind"] for e in ev if e["kind"] in ("ttl", "context_saved")][-2:]
                == ["ttl", "context_saved"]
            ),
        )
        order = [e["kind"] for e in events if e["kind"] in ("ttl", "context_saved", "context_restored")]
        # The old child's snapshot, restored by the new one; (the old one's own save when it is
        # stopped, once the new one is ready); the ttl, and the new one's save.
        assert order[:2] == ["context_saved", "context_restored"], order
        assert order[-2:] == ["ttl", "context_saved"], order
