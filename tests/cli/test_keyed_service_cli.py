"""Issue 37 item 9: the CLI once the service has an `api_key`, as a user runs it (real subprocesses,
a real `forge serve`, the real llama-server on the tiny GGUF).

Before: `forge ps` / `activity` / `chat` / `load NAME -p` printed the service's own
`missing or invalid API key — send Authorization: Bearer KEY`, with nothing about FORGE_API_KEY or
--config (the two ways the CLI sends a key), and `forge load notes.txt` / `forge load missing.gguf`
gave that auth error instead of "not a GGUF" / "no model file".
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.service import FORGE, Service, model_section, running_service, write_config

KEY = "cli-s3cret"


@pytest.fixture(scope="module")
def keyed(
    tmp_path_factory: pytest.TempPathFactory, tiny_gguf: Path, llama_server_bin: Path
) -> Iterator[Service]:
    tmp = tmp_path_factory.mktemp("keyed")
    cfg = write_config(
        tmp / "forge.toml", f'[server]\napi_key = "{KEY}"\n' + model_section("tiny", tiny_gguf, ctx_size=512)
    )
    with running_service(cfg, tmp / "state", llama_server_bin, api_key=KEY) as s:
        yield s


def _forge(
    svc: Service, tmp_path: Path, *args: str, key: str | None = None, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """`forge ARGS` as a user in another directory: no default config of its own (an empty XDG
    config home), the service found through its state dir, FORGE_API_KEY only when given."""
    env = dict(
        os.environ,
        FORGE_STATE_DIR=str(svc.state_dir),
        XDG_CONFIG_HOME=str(tmp_path / "xdg"),
        COLUMNS="200",
        NO_COLOR="1",
    )
    env.pop("FORGE_API_KEY", None)
    if key is not None:
        env["FORGE_API_KEY"] = key
    return subprocess.run(
        [*FORGE, *args], input=stdin, capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path
    )


COMMANDS = [
    ["ps"],
    ["activity"],
    ["chat", "tiny"],
    ["load", "tiny", "-p", "Hi", "-n", "2"],
    ["load", "tiny"],
    ["unload", "tiny"],
    ["logs", "tiny"],
]


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: " ".join(a))
def test_without_the_key_one_line_names_both_ways_to_give_it(
    keyed: Service, tmp_path: Path, args: list[str]
) -> None:
    r = _forge(keyed, tmp_path, *args, stdin="/exit\n")
    assert r.returncode == 1, (r.stdout, r.stderr)
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith(f"error: the forge service at {keyed.url} needs an API key"), line
    assert "FORGE_API_KEY" in line and "--config" in line, line
    wrong = _forge(keyed, tmp_path, *args, key="not-the-key", stdin="/exit\n")
    assert wrong.returncode == 1 and "refused the API key this command sent" in wrong.stderr, wrong.stderr


def test_either_way_works(keyed: Service, tmp_path: Path) -> None:
    """FORGE_API_KEY, or --config with the service's forge.toml: for every command that asks it."""
    assert _forge(keyed, tmp_path, "ps", key=KEY).returncode == 0
    cfg = str(keyed.config)
    r = _forge(keyed, tmp_path, "ps", "--config", cfg)
    assert r.returncode == 0 and "tiny" in r.stdout, r.stderr
    assert _forge(keyed, tmp_path, "activity", "--config", cfg).returncode == 0
    r = _forge(keyed, tmp_path, "load", "tiny", "-p", "Hi", "-n", "2", "--config", cfg)
    assert r.returncode == 0 and f"forge service at {keyed.url}" in r.stderr, r.stderr
    r = _forge(keyed, tmp_path, "chat", "tiny", "--config", cfg, stdin="/exit\n")
    assert r.returncode == 0, r.stderr
    r = _forge(keyed, tmp_path, "load", "tiny", key=KEY)
    assert r.returncode == 0 and "tiny: ready" in r.stderr, r.stderr
    assert _forge(keyed, tmp_path, "unload", "tiny", "--config", cfg).returncode == 0


def test_a_file_is_checked_before_the_service_is_asked(keyed: Service, tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("not a model\n")
    for args in (["load", "notes.txt"], ["load", "notes.txt", "-p", "Hi"], ["chat", "notes.txt"]):
        r = _forge(keyed, tmp_path, *args, stdin="/exit\n")
        assert r.returncode == 2, (args, r.stderr)
        assert "is not a GGUF model" in r.stderr and "API key" not in r.stderr, (args, r.stderr)
    for args in (["load", "missing.gguf"], ["load", "./missing"], ["chat", "missing.gguf"]):
        r = _forge(keyed, tmp_path, *args, stdin="/exit\n")
        assert r.returncode == 2, (args, r.stderr)
        assert "no model file at" in r.stderr and "API key" not in r.stderr, (args, r.stderr)
