"""``path`` of a ``backend = "command"`` model is what its ``${MODEL}`` stands for: required when
``cmd`` uses ``${MODEL}`` (one line naming the fix), optional when it does not, and never judged as
a file (``--check-config`` has no "no file at …" note for it). Any other backend still needs one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rocmforge_supervisor._errors import ConfigError
from rocmforge_supervisor.config import ForgeConfig, ForgeSettings, load_config

SERVER = 'cmd = ["python3", "-m", "http.server", "${PORT}"]\n'
USES_MODEL = 'cmd = ["/opt/vllm/bin/vllm", "serve", "${MODEL}", "--port", "${PORT}"]\n'


def _load(tmp_path: Path, text: str) -> ForgeConfig:
    f = tmp_path / "forge.toml"
    f.write_text(text)
    settings = ForgeSettings(config_home=tmp_path / "xdg", state_dir=tmp_path / "state")
    return load_config(f, settings, env={}, system_dir=tmp_path / "etc")


def test_a_command_that_does_not_use_model_needs_no_path(tmp_path: Path) -> None:
    m = _load(tmp_path, '[models.echo]\nbackend = "command"\n' + SERVER).models["echo"]
    assert m.backend == "command" and not m.path


def test_a_command_that_uses_model_needs_a_path_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        _load(tmp_path, '[models.big]\nbackend = "command"\n' + USES_MODEL)
    message = str(err.value)
    assert "\n" not in message, message
    assert message.startswith("config forge.toml: models.big.path: "), message
    assert "${MODEL}" in message and "path = " in message, message
    # what ${MODEL} stands for goes as written (a hub id is no file next to forge.toml) ...
    ok = _load(tmp_path, '[models.big]\nbackend = "command"\npath = "Qwen/Qwen3-32B"\n' + USES_MODEL)
    assert ok.models["big"].path == "Qwen/Qwen3-32B"
    # ... unless it is written as a path relative to the file
    here = _load(tmp_path, '[models.big]\nbackend = "command"\npath = "./weights"\n' + USES_MODEL)
    assert here.models["big"].path == str(tmp_path / "weights")


@pytest.mark.parametrize("backend", ["", 'backend = "llama"\n', 'backend = "whisper"\n'])
def test_every_other_backend_still_needs_a_path(tmp_path: Path, backend: str) -> None:
    with pytest.raises(ConfigError) as err:
        _load(tmp_path, "[models.m]\n" + backend + "preload = false\n")
    message = str(err.value)
    assert "\n" not in message and "models.m.path" in message, message
    assert "add it" in message or "path = " in message, message


def _check_config(tmp_path: Path, text: str) -> subprocess.CompletedProcess[str]:
    f = tmp_path / "forge.toml"
    f.write_text(text)
    env = dict(os.environ, FORGE_STATE_DIR=str(tmp_path / "state"), COLUMNS="250", NO_COLOR="1")
    cmd = [sys.executable, "-m", "rocmforge_supervisor.cli", "serve", "--check-config", "--config", str(f)]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)


@pytest.mark.parametrize(
    "text",
    [
        '[models.echo]\nbackend = "command"\n' + SERVER,
        '[models.echo]\nbackend = "command"\npath = "echo-model"\n' + SERVER,
        '[models.big]\nbackend = "command"\npath = "Qwen/Qwen3-32B"\n' + USES_MODEL,
    ],
)
def test_check_config_judges_no_path_forge_never_reads(tmp_path: Path, text: str) -> None:
    r = _check_config(tmp_path, text)
    assert r.returncode == 0, r.stderr
    assert r.stderr.startswith("config OK"), r.stderr
    assert "no file at" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_check_config_still_notes_a_missing_llama_model_file(tmp_path: Path) -> None:
    r = _check_config(tmp_path, f'[models.m]\npath = "{tmp_path / "later.gguf"}"\n')
    assert r.returncode == 0, r.stderr
    assert "note: models.m: no file at" in r.stderr, r.stderr
