"""``forge inspect`` says which config its defaults came from: a ``[models.NAME]`` of ``--config``
(the file named), the default config, or none read at all (where it looked). ``make run`` serves
``examples/forge.toml``: without ``--config`` that is not the one read, and the output says so."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

FORGE = [sys.executable, "-m", "rocmforge_supervisor.cli"]


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    e = dict(os.environ, XDG_CONFIG_HOME=str(tmp_path / "xdg"), COLUMNS="250", NO_COLOR="1")
    e["FORGE_STATE_DIR"] = str(tmp_path / "state")
    for k in [k for k in e if k.startswith("FORGE_MODELS")]:
        del e[k]
    return e


def _inspect(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*FORGE, "inspect", *args], capture_output=True, text=True, env=env, timeout=60)


def test_inspect_names_the_config_it_read(tmp_path: Path, tiny_gguf: Path, env: dict[str, str]) -> None:
    config = tmp_path / "served.toml"
    config.write_text(f'[models.t]\npath = "{tiny_gguf}"\nctx_size = 256\nparallel = 2\n')

    r = _inspect(env, "t", "--config", str(config))
    assert r.returncode == 0, r.stderr
    assert "estimate: ctx 256" in r.stdout, r.stdout
    assert f"(as [models.t] of the config serves it: {config})" in r.stderr, r.stderr

    data = json.loads(_inspect(env, "t", "--config", str(config), "--json").stdout)
    assert data["config"] == {"read": str(config), "served_as": "t"}

    # a file, with that config: read, but MODEL is none of its models
    r = _inspect(env, str(tiny_gguf), "--config", str(config))
    assert r.returncode == 0, r.stderr
    assert f"config {config} read" in r.stderr and "llama-server's defaults" in r.stderr, r.stderr

    # the default config (XDG), found without --config
    (tmp_path / "xdg" / "rocmforge").mkdir(parents=True)
    default = tmp_path / "xdg" / "rocmforge" / "forge.toml"
    default.write_text(config.read_text())
    r = _inspect(env, "t")
    assert r.returncode == 0 and f"serves it: {default})" in r.stderr, r.stderr


def test_inspect_says_it_read_no_config(tmp_path: Path, tiny_gguf: Path, env: dict[str, str]) -> None:
    r = _inspect(env, str(tiny_gguf))
    assert r.returncode == 0, r.stderr
    (line,) = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert line.startswith("(no config read: none at ") and str(tmp_path / "xdg") in line, line
    assert "--config FILE" in line, line
    data = json.loads(_inspect(env, str(tiny_gguf), "--json").stdout)
    assert data["config"] == {"read": None, "served_as": None}
