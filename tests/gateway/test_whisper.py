"""backend = "whisper": a real `forge serve` running the project's real whisper-server on spoken
audio (espeak-ng), driven by the real OpenAI SDK (see tests/support/whisper.py for the model).

One service for the module (the child restarts are part of a test, and leave it ready again).
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import psutil
import pytest

from rocmforge_supervisor.config import ForgeSettings
from tests.support.service import FAST, Service, running_service, wait_for, write_config
from tests.support.whisper import spoken_wav, whisper_model_or_skip, whisper_server_or_skip

pytestmark = pytest.mark.timeout(300)

FORMATS = ("json", "text", "srt", "vtt", "verbose_json")


def _whisper_children(pid: int) -> list[psutil.Process]:
    try:
        kids = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    out = []
    for p in kids:
        try:
            if "whisper-server" in p.name() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.Error:
            pass
    return out


@pytest.fixture(scope="module")
def whisper_parts(forge_settings: ForgeSettings, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    binary = whisper_server_or_skip(forge_settings)
    model, real = whisper_model_or_skip(forge_settings)
    wav = spoken_wav(tmp_path_factory.mktemp("audio") / "fox.wav")
    return {"binary": binary, "model": model, "real": real, "wav": wav}


def _config(d: Path, model: Path, extra: str = "") -> Path:
    return write_config(
        d / "forge.toml",
        FAST + f'\n[models.stt]\npath = "{model}"\nbackend = "whisper"\npreload = true\n{extra}',
    )


@pytest.fixture(scope="module")
def svc(
    whisper_parts: dict[str, Any], llama_server_bin: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Service]:
    d = tmp_path_factory.mktemp("whisper-svc")
    cfg = _config(d, whisper_parts["model"])
    env = {"FORGE_WHISPER_SERVER": str(whisper_parts["binary"])}
    with running_service(cfg, d / "state", llama_server_bin, extra_env=env) as s:
        yield s
    assert not _whisper_children(s.proc.pid), "whisper-server left running after forge stopped"


def _sdk(svc: Service) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{svc.url}/v1", api_key="none", max_retries=0, timeout=120)


def _ready_pid(svc: Service) -> int:
    row: dict[str, Any] = wait_for(
        lambda: (m := svc.model("stt"))["state"] == "ready" and m["pid"] and m, timeout=60, what="stt ready"
    )
    return int(row["pid"])


def test_the_model_lists_its_backend_and_one_request_at_a_time(svc: Service) -> None:
    row = svc.model("stt")
    assert row["backend"] == "whisper" and row["state"] == "ready" and row["max_concurrency"] == 1
    assert row["devices"] == ["cpu"]
    # Placement counts it: the estimate from the file, then what the child reported it allocated.
    assert row["memory"]["estimated_bytes"]["cpu"] > 0 and row["memory"]["actual_bytes"]["cpu"] > 50_000_000
    with svc.client() as c:
        listed = {m["id"]: m for m in c.get("/v1/models").json()["data"]}
    assert listed["stt"]["backend"] == "whisper" and listed["stt"]["state"] == "ready"
    child = psutil.Process(row["pid"])
    assert "whisper-server" in child.name() and "-ng" in child.cmdline()  # on the CPU: no GPU at all


@pytest.mark.parametrize("fmt", FORMATS)
def test_each_response_format_through_the_openai_sdk(
    svc: Service, whisper_parts: dict[str, Any], fmt: str
) -> None:
    with whisper_parts["wav"].open("rb") as f:
        out: Any = _sdk(svc).audio.transcriptions.create(model="stt", file=f, response_format=fmt)  # type: ignore[call-overload]
    text = out if isinstance(out, str) else out.text
    if fmt == "vtt":
        assert out.startswith("WEBVTT")
    if fmt == "verbose_json":
        # whisper-server decoded the whole clip (espeak's ~3 s): the audio really went through.
        assert out.task == "transcribe" and 1.5 < out.duration < 10, out
        assert isinstance(out.segments, list)
    if whisper_parts["real"]:
        # tiny.en on espeak's voice hears "The quick roundfire jump over the lazy dog."
        assert "quick" in text.lower() and "lazy dog" in text.lower(), text
        if fmt in ("srt", "vtt"):
            assert "00:00:00" in out and "-->" in out, out
        if fmt == "verbose_json":
            assert out.segments and out.segments[0].end > out.segments[0].start
    else:
        assert isinstance(text, str)  # the weightless test model transcribes nothing


def test_a_transcription_is_one_request_like_any_other(svc: Service, whisper_parts: dict[str, Any]) -> None:
    """Through the one forwarder and its one response: counted in forge_requests_total, a row in
    the activity log, the request id echoed, each format's content type."""
    metric = 'forge_requests_total{endpoint="/v1/audio/transcriptions",model="stt",status="200"}'

    def count(text: str) -> float:
        line = next((x for x in text.splitlines() if x.startswith(metric)), None)
        return float(line.split()[-1]) if line else 0.0

    with svc.client() as c:
        before = count(c.get("/metrics").text)
        for fmt, kind in (("text", "text/plain"), ("vtt", "text/vtt"), ("json", "application/json")):
            r = c.post(
                "/v1/audio/transcriptions",
                data={"model": "stt", "response_format": fmt},
                files={"file": ("fox.wav", whisper_parts["wav"].read_bytes())},
                headers={"X-Request-ID": f"audio-{fmt}"},
            )
            assert r.status_code == 200, r.text
            assert r.headers["content-type"].startswith(kind) and r.headers["x-request-id"] == f"audio-{fmt}"
        assert count(c.get("/metrics").text) == before + 3

        def row() -> dict[str, Any] | None:
            rows = c.get("/api/activity", params={"limit": 50}).json()["activity"]
            return next((r for r in rows if r["request_id"] == "audio-vtt"), None)

        found: dict[str, Any] = wait_for(row, timeout=30, what="the transcription's activity row")
    assert found["route"] == "/v1/audio/transcriptions" and found["status"] == 200, found


def test_translations_ask_whisper_to_translate(svc: Service, whisper_parts: dict[str, Any]) -> None:
    """(The SDK's translations.create is deprecated, and warnings are errors here: plain HTTP.)"""
    with svc.client() as c:
        r = c.post(
            "/v1/audio/translations",
            data={"model": "stt", "response_format": "verbose_json"},
            files={"file": ("fox.wav", whisper_parts["wav"].read_bytes())},
        )
    assert r.status_code == 200, r.text
    assert r.json()["task"] == "translate" and r.json()["duration"] > 1.5


def test_two_concurrent_requests_both_succeed_one_queues(svc: Service, whisper_parts: dict[str, Any]) -> None:
    audio = whisper_parts["wav"].read_bytes()

    def one() -> int:
        with svc.client() as c:
            r = c.post("/v1/audio/transcriptions", data={"model": "stt"}, files={"file": ("a.wav", audio)})
        return r.status_code

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(one) for _ in range(2)]
        # whisper-server takes one at a time: forge holds the second in the model's queue.
        wait_for(lambda: svc.model("stt")["waiting"] == 1, timeout=60, what="the second request queued")
        assert svc.model("stt")["in_flight"] == 1
        assert [f.result(timeout=120) for f in futures] == [200, 200]


def test_sigkill_of_the_child_mid_request_is_a_clean_error_then_a_restart(
    svc: Service, whisper_parts: dict[str, Any]
) -> None:
    pid = _ready_pid(svc)
    restarts = svc.model("stt")["restarts"]
    audio = whisper_parts["wav"].read_bytes()

    def one() -> httpx.Response:
        with svc.client() as c:
            return c.post("/v1/audio/transcriptions", data={"model": "stt"}, files={"file": ("a.wav", audio)})

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pending = pool.submit(one)
        wait_for(lambda: svc.model("stt")["in_flight"] == 1, timeout=30, what="the request in flight")
        os.kill(pid, signal.SIGKILL)
        r = pending.result(timeout=120)
    assert r.status_code in (502, 503), r.text
    assert r.json()["error"]["message"]  # OpenAI's error shape, naming what happened
    new = wait_for(
        lambda: (m := svc.model("stt"))["state"] == "ready" and m["pid"] not in (None, pid) and m,
        timeout=60,
        what="a new child",
    )
    assert new["restarts"] == restarts + 1
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    with whisper_parts["wav"].open("rb") as f:
        assert _sdk(svc).audio.transcriptions.create(model="stt", file=f).text is not None


def _post(svc: Service, data: dict[str, str], files: dict[str, Any] | None) -> httpx.Response:
    with svc.client() as c:
        return c.post("/v1/audio/transcriptions", data=data, files=files)


@pytest.mark.parametrize(
    ("data", "files", "status", "param", "words"),
    [
        ({"model": "stt"}, {"file": ("notes.txt", b"hello, not audio")}, 400, "file", "not audio"),
        ({"model": "stt"}, {"file": ("empty.wav", b"")}, 400, "file", "empty"),
        ({"model": "stt"}, None, 400, "file", '"file"'),
        ({"model": "stt"}, {"file": ("big.wav", b"RIFF" + bytes(50_000_000))}, 413, "file", "over"),
        ({}, {"file": ("a.wav", b"RIFF0000WAVE")}, 400, None, "model"),
        ({"model": "nope"}, {"file": ("a.wav", b"RIFF0000WAVE")}, 404, None, "nope"),
        (
            {"model": "stt", "response_format": "xml"},
            {"file": ("a.wav", b"RIFF0000WAVE")},
            400,
            "response_format",
            "xml",
        ),
    ],
    ids=["not-audio", "empty", "no-file", "50MB", "no-model", "unknown-model", "bad-format"],
)
def test_bad_input_is_a_4xx_naming_the_field(
    svc: Service,
    data: dict[str, str],
    files: dict[str, Any] | None,
    status: int,
    param: str | None,
    words: str,
) -> None:
    pid = _ready_pid(svc)
    if files is None:
        data = {**data, "language": "en"}  # a multipart form without a file part
        files = {"other": ("x.bin", b"x")}
    r = _post(svc, data, files)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert words in error["message"] and (param is None or error["param"] == param), error
    assert svc.model("stt")["pid"] == pid  # the child never saw it: nothing crashed


def test_a_container_that_needs_ffmpeg_is_refused_without_it(svc: Service) -> None:
    if shutil.which("ffmpeg") is not None:
        pytest.skip("ffmpeg is installed here: the child converts M4A (--convert)")
    m4a = b"\x00\x00\x00\x20ftypM4A " + bytes(64)
    r = _post(svc, {"model": "stt"}, {"file": ("talk.m4a", m4a)})
    assert r.status_code == 400 and r.json()["error"]["param"] == "file"
    assert "M4A" in r.json()["error"]["message"] and "ffmpeg" in r.json()["error"]["message"]


def test_a_llama_route_to_a_whisper_model_is_a_400(svc: Service) -> None:
    with svc.client() as c:
        chat = {"model": "stt", "messages": [{"role": "user", "content": "hi"}]}
        r = c.post("/v1/chat/completions", json=chat)
        ollama = c.post("/api/chat", json={**chat, "stream": False})
        show = c.post("/api/show", json={"model": "stt"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "model"
    assert "/v1/audio/transcriptions" in r.json()["error"]["message"]
    assert ollama.status_code == 400 and "whisper" in ollama.json()["error"]
    assert show.status_code == 400 and "whisper" in show.json()["error"]


def test_the_status_page_shows_the_backend(svc: Service, tmp_path: Path) -> None:
    """In a real chromium: the whisper model's row says what runs it, and the page has no errors."""
    from selenium.webdriver.common.by import By

    from tests.support.browser import chromium, model_row, row_state, severe_console_errors, wait_until

    with chromium(tmp_path / "profile") as driver:
        driver.get(svc.url + "/")
        wait_until(driver, lambda d: row_state(d, "stt") == "ready", "the stt row ready")
        note = model_row(driver, "stt").find_element(By.CSS_SELECTOR, ".modalities")
        assert note.get_attribute("textContent") == "whisper · speech to text"  # (CSS shows it upper-case)
        assert severe_console_errors(driver) == []


def test_no_orphan_after_sigkill_of_forge(
    whisper_parts: dict[str, Any], llama_server_bin: Path, tmp_path: Path
) -> None:
    cfg = _config(tmp_path, whisper_parts["model"])
    env = {"FORGE_WHISPER_SERVER": str(whisper_parts["binary"])}
    with running_service(cfg, tmp_path / "state", llama_server_bin, extra_env=env) as s:
        (child,) = wait_for(lambda: _whisper_children(s.proc.pid), timeout=60, what="the whisper child")
        s.proc.send_signal(signal.SIGKILL)
        s.proc.wait(timeout=10)
        _, alive = psutil.wait_procs([child], timeout=10)
        assert not alive, "whisper-server outlived its forge (parent-death signal)"


def test_config_names_the_backend_field_and_its_choices(
    tmp_path: Path, forge_settings: ForgeSettings
) -> None:
    from rocmforge_supervisor._errors import ConfigError
    from rocmforge_supervisor.config import load_config

    bad = write_config(tmp_path / "forge.toml", '[models.x]\npath = "m.bin"\nbackend = "vllm"\n')
    with pytest.raises(ConfigError) as err:
        load_config(bad, forge_settings, env={})
    assert "models.x.backend" in str(err.value) and "'llama', 'whisper' or 'command'" in str(err.value)
    llama_key = write_config(
        tmp_path / "forge2.toml", '[models.x]\npath = "m.bin"\nbackend = "whisper"\nctx_size = 512\n'
    )
    with pytest.raises(ConfigError) as err:
        load_config(llama_key, forge_settings, env={})
    assert "ctx_size does not apply" in str(err.value)
    ok = write_config(tmp_path / "forge3.toml", '[models.x]\npath = "m.bin"\nbackend = "whisper"\n')
    assert load_config(ok, forge_settings, env={}).models["x"].effective_max_concurrency == 1


def test_not_a_whisper_model_is_refused_before_any_spawn(tmp_path: Path) -> None:
    from rocmforge_supervisor._errors import InvalidModelFile
    from rocmforge_supervisor.models import inspect_whisper

    gguf = tmp_path / "x.gguf"
    gguf.write_bytes(b"GGUF" + bytes(60))
    with pytest.raises(InvalidModelFile) as err:
        inspect_whisper(gguf)
    assert "not a whisper.cpp model" in str(err.value)


def test_the_whisper_child_is_argv_built_for_whisper_server() -> None:
    from rocmforge_supervisor._whisper_argv import whisper_argv

    argv = whisper_argv(
        binary=Path("/b/whisper-server"),
        model_path=Path("/m.bin"),
        host="127.0.0.1",
        port=5,
        cpu_only=True,
        extra_args=["-bs", "2"],
        which=lambda name: None,
        threads=3,
    )
    assert argv == [
        "/b/whisper-server",
        "-m",
        "/m.bin",
        "--host",
        "127.0.0.1",
        "--port",
        "5",
        "-t",
        "3",
        "-ng",
        "-bs",
        "2",
    ]
    with_ffmpeg = whisper_argv(
        binary=Path("w"), model_path=Path("m"), host="h", port=1, cpu_only=False, extra_args=[],
        which=lambda name: "/usr/bin/ffmpeg", threads=1,
    )  # fmt: skip
    assert "--convert" in with_ffmpeg and "-ng" not in with_ffmpeg


def test_the_build_plan_builds_whisper_server(tmp_path: Path) -> None:
    from rocmforge_supervisor.binaries import make_plan

    plan = make_plan(
        accel="cpu",
        source=tmp_path,
        build_dir=tmp_path / "b",
        commit="f24588a272ae8e23280d9c220536437164e6ed28",
        which=lambda name: f"/usr/bin/{name}",
        program="whisper-server",
    )
    assert "whisper-server" in plan.build and "-DWHISPER_BUILD_SERVER=ON" in plan.configure
    assert not any(a.startswith("-DLLAMA_") for a in plan.configure) and plan.program == "whisper-server"


def test_a_failing_selftest_is_reported(tmp_path: Path) -> None:
    from rocmforge_supervisor.binaries._whisper import whisper_selftest

    model = tmp_path / "m.bin"
    model.write_bytes(b"lmgg")
    ok, detail = whisper_selftest(Path("/bin/false"), model, timeout=20)
    assert not ok and "exited" in detail


def test_verbose_json_renders_openai_shapes() -> None:
    from rocmforge_supervisor.service.proxy._audio import render

    result = {
        "task": "transcribe",
        "language": "english",
        "duration": 3.5,
        "text": " Hello there.",
        "segments": [{"id": 0, "text": " Hello there.", "start": 0.0, "end": 3.5, "tokens": [1, 2]}],
    }
    assert json.loads(render(result, "json")) == {"text": "Hello there."}
    assert render(result, "srt").decode() == "1\n00:00:00,000 --> 00:00:03,500\nHello there.\n"
    assert render(result, "vtt").decode() == "WEBVTT\n\n00:00:00.000 --> 00:00:03.500\nHello there.\n"
    verbose = json.loads(render(result, "verbose_json"))
    assert verbose["segments"][0]["end"] == 3.5 and verbose["text"] == "Hello there."


def test_the_text_is_one_line_as_openai_gives_it() -> None:
    """whisper-server joins its segments with line breaks, mid-sentence; OpenAI's ``text`` is one
    line: json, text and verbose_json's text join them with spaces (srt/vtt keep one cue each)."""
    from rocmforge_supervisor.service.proxy._audio import render

    result = {
        "text": " The quick brown fox\n jumps over\n the lazy dog.\n",
        "segments": [
            {"id": 0, "text": " The quick brown fox", "start": 0.0, "end": 1.0},
            {"id": 1, "text": " jumps over", "start": 1.0, "end": 2.0},
            {"id": 2, "text": " the lazy dog.", "start": 2.0, "end": 3.0},
        ],
    }
    one_line = "The quick brown fox jumps over the lazy dog."
    assert json.loads(render(result, "json")) == {"text": one_line}
    assert render(result, "text").decode() == one_line + "\n"
    assert json.loads(render(result, "verbose_json"))["text"] == one_line
    assert render(result, "srt").decode().count("-->") == 3


def test_an_hf_file_reference_resolves_from_the_hub_cache(tmp_path: Path) -> None:
    """``hf:org/repo:FILE`` for a whisper model (not a GGUF): the file by its name, here from a
    Hugging Face cache laid out as huggingface-hub writes it, offline."""
    from rocmforge_supervisor.models import resolve_hf_file

    snapshot = tmp_path / "hub" / "models--ggerganov--whisper.cpp" / "snapshots" / "0123abc"
    snapshot.mkdir(parents=True)
    (snapshot / "ggml-tiny.en.bin").write_bytes(b"lmgg" + bytes(60))
    (tmp_path / "hub" / "models--ggerganov--whisper.cpp" / "refs").mkdir()
    (tmp_path / "hub" / "models--ggerganov--whisper.cpp" / "refs" / "main").write_text("0123abc")
    settings = ForgeSettings(hf_cache_dir=tmp_path / "hub", hf_offline=True)
    path = resolve_hf_file("ggerganov/whisper.cpp:ggml-tiny.en.bin", settings)
    assert path.read_bytes()[:4] == b"lmgg"
    from rocmforge_supervisor._errors import ForgeError

    with pytest.raises(ForgeError) as err:
        resolve_hf_file("ggerganov/whisper.cpp:ggml-base.en.bin", settings)
    assert "not in the Hugging Face cache" in str(err.value)


def test_a_refused_build_leaves_no_cache_entry(tmp_path: Path) -> None:
    """The one install step of both builders: a self-test that refuses the build (here: raises)
    leaves neither the entry nor a staging directory; a passing one appears whole, metadata last."""
    from rocmforge_supervisor._errors import SelfTestFailed
    from rocmforge_supervisor.binaries._builder import install_staged

    def refuse(staging: Path) -> dict[str, object]:
        (staging / "bin" / "whisper-server").write_text("built")
        raise SelfTestFailed("the new whisper-server failed its self-test: exited with code 1")

    final = tmp_path / "whisper-key"
    with pytest.raises(SelfTestFailed):
        install_staged(tmp_path, "whisper-key", final, refuse)
    assert sorted(p.name for p in tmp_path.iterdir()) == []

    def accept(staging: Path) -> dict[str, object]:
        (staging / "bin" / "whisper-server").write_text("built")
        return {"commit": "f24588a"}

    install_staged(tmp_path, "whisper-key", final, accept)
    assert json.loads((final / "build-info.json").read_text()) == {"commit": "f24588a"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["whisper-key"]


def test_forge_build_whisper_locates_and_refuses_llama_only_flags(whisper_parts: dict[str, Any]) -> None:
    import subprocess
    import sys

    env = {**os.environ, "FORGE_WHISPER_SERVER": str(whisper_parts["binary"])}
    forge = [sys.executable, "-m", "rocmforge_supervisor.cli", "build", "--whisper"]
    found = subprocess.run([*forge, "--print-path"], capture_output=True, text=True, env=env, timeout=60)
    assert found.returncode == 0 and found.stdout.strip() == str(whisper_parts["binary"]), found.stderr
    bad = subprocess.run([*forge, "--rpc"], capture_output=True, text=True, env=env, timeout=60)
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [
        "error: --rpc does not apply to --whisper — drop --rpc: whisper-server builds from its pinned source"
    ]
    missing = {**env, "FORGE_WHISPER_SERVER": "/nonexistent/whisper-server"}
    gone = subprocess.run([*forge, "--print-path"], capture_output=True, text=True, env=missing, timeout=60)
    assert gone.returncode != 0 and len(gone.stderr.strip().splitlines()) == 1
    assert "FORGE_WHISPER_SERVER" in gone.stderr


def test_an_unreachable_hub_fails_at_once_in_one_line_naming_the_offline_way(
    llama_server_bin: Path, forge_settings: ForgeSettings, tmp_path: Path
) -> None:
    """No network, ``path = "hf:…ggml-tiny.en.bin"`` not cached: the model fails within seconds
    (not after huggingface-hub's five retries, ~23 s), its reason is printed once (no retry
    warnings, nothing twice) and names ``forge pull --whisper``, and ``forge ps`` shows all of it.
    (``.invalid`` never resolves: RFC 6761.)"""
    binary = whisper_server_or_skip(forge_settings)
    cfg = _config(tmp_path, Path("unused"))
    cfg.write_text(
        cfg.read_text().replace('path = "unused"', 'path = "hf:ggerganov/whisper.cpp:ggml-tiny.en.bin"')
    )
    env = {
        "FORGE_WHISPER_SERVER": str(binary),
        "FORGE_HF_ENDPOINT": "https://hub.invalid",
        "FORGE_HF_CACHE_DIR": str(tmp_path / "empty-hub-cache"),
    }
    state = tmp_path / "state"
    with running_service(cfg, state, llama_server_bin, extra_env=env, wait_ready=False) as s:
        row = wait_for(
            lambda: (m := s.model("stt"))["state"] == "failed" and m, timeout=15, what="stt failed"
        )
        reason = str(row["last_error"])
        assert "hub.invalid" in reason and "forge pull --whisper tiny.en" in reason, reason
        ps = subprocess.run(
            [sys.executable, "-m", "rocmforge_supervisor.cli", "ps", "--config", str(cfg)],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "FORGE_STATE_DIR": str(state), "COLUMNS": "100", "NO_COLOR": "1"},
        )
        assert ps.returncode == 0, ps.stderr
        shown = " ".join(ps.stdout.split())
        assert "forge pull --whisper tiny.en" in shown and "hub.invalid" in shown, ps.stdout
    log = (state / "serve.stderr").read_text()
    assert "Retrying in" not in log, log
    assert log.count("does not resolve") == 1, log
