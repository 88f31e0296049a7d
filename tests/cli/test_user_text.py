"""Text that came from a user or a file is printed as given, never read as rich markup.

A path or a name with ``[brackets]`` used to crash `forge load` / `forge inspect` with a
``rich.errors.MarkupError`` traceback, or make the CLI name a different file (``[bold]`` eaten),
and a config error lost the ``[server]`` in its hint. Every command that echoes a name or a path
is run here, as a real subprocess, with such text.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.service import Service, running_service, write_config

FORGE = [sys.executable, "-m", "rocmforge_supervisor.cli"]
#: A closing tag with no opener (rich raises MarkupError), and a style tag (rich eats it).
ODD_DIRS = ("[/]broken", "[bold]styled", "[red]x[/red] y")


def run(*args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*FORGE, *args], capture_output=True, text=True, env=env, timeout=timeout)


@pytest.fixture
def env(tmp_path: Path, llama_server_bin: Path) -> dict[str, str]:
    e = dict(os.environ, FORGE_STATE_DIR=str(tmp_path / "state"), COLUMNS="250", NO_COLOR="1")
    e["FORGE_LLAMA_SERVER"] = str(llama_server_bin)
    e.pop("FORGE_API_KEY", None)
    return e


def _ok(r: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in r.stderr and "MarkupError" not in r.stderr, r.stderr


@pytest.mark.parametrize("odd", ODD_DIRS)
def test_inspect_and_load_a_bracketed_path(
    odd: str, tmp_path: Path, tiny_gguf: Path, env: dict[str, str]
) -> None:
    model = tmp_path / odd / "[v2] tiny.gguf"
    model.parent.mkdir(parents=True)
    shutil.copy(tiny_gguf, model)
    r = run("inspect", str(model), env=env)
    _ok(r)
    assert r.returncode == 0 and str(model) in r.stdout, r.stdout
    r = run("load", str(model), "-p", "Hi", "-n", "2", "--gpu", "cpu", "-c", "256", env=env)
    _ok(r)
    assert r.returncode == 0, r.stderr
    missing = tmp_path / odd / "[v3] gone.gguf"
    for cmd in (
        ["inspect", str(missing)],
        ["load", str(missing), "-p", "x"],
        ["chat", str(missing), "--private"],
    ):
        r = run(*cmd, env=env)
        _ok(r)
        assert r.returncode == 2 and f"no model file at {missing}" in r.stderr, r.stderr


def test_bad_gguf_and_hub_reference_with_brackets(tmp_path: Path, env: dict[str, str]) -> None:
    bad = tmp_path / "[/]notes [x].gguf"  # a directory "[" holding "]notes [x].gguf"
    bad.parent.mkdir()
    bad.write_text("not a model\n" * 20)
    r = run("inspect", str(bad), env=env)
    _ok(r)
    assert r.returncode == 2 and str(bad) in r.stderr
    r = run("pull", "[bold]org/[x]repo", env=dict(env, HF_HUB_OFFLINE="1"))
    _ok(r)
    assert r.returncode == 2 and "[bold]org/[x]repo" in r.stderr, r.stderr


def test_option_values_with_brackets(tiny_gguf: Path, env: dict[str, str]) -> None:
    for args, needle in (
        (["load", str(tiny_gguf), "--gpu", "[/]", "-p", "x"], "'[/]'"),
        (["inspect", str(tiny_gguf), "--cache-type-k", "[/]q8"], "'[/]q8'"),
        (["inspect", str(tiny_gguf), "--gpu", "[bold]amd:0"], "'[bold]amd:0'"),
    ):
        r = run(*args, env=env)
        _ok(r)
        assert r.returncode == 2 and needle in r.stderr, r.stderr


def test_config_errors_keep_their_brackets(tmp_path: Path, env: dict[str, str]) -> None:
    d = tmp_path / "[/]conf"
    d.mkdir(parents=True)
    cfg = write_config(d / "forge.toml", '[server]\nhost = "0.0.0.0"\n')
    r = run("serve", "--config", str(cfg), env=env)
    _ok(r)
    assert r.returncode == 2
    assert "allow_unauthenticated = true in [server]" in r.stderr and str(cfg) in r.stderr, r.stderr
    cfg = write_config(d / "bad.toml", '[models."[red]m"]\npath = "x"\nctxsize = 1\n')
    r = run("serve", "--config", str(cfg), env=env)
    _ok(r)
    assert r.returncode == 2 and "models.[red]m: model name '[red]m' may only use" in r.stderr, r.stderr


def test_bind_override_names_the_option_and_the_file(tmp_path: Path, env: dict[str, str]) -> None:
    """`forge serve --host 0.0.0.0` said `config: server.host`, naming no file at all."""
    cfg = write_config(tmp_path / "forge.toml", "")
    r = run("serve", "--config", str(cfg), "--host", "0.0.0.0", env=env)
    assert r.returncode == 2
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("error: the --host option: server.host: host '0.0.0.0' is reachable"), line
    assert f"set api_key in [server] in {cfg}" in line


def test_build_print_path_with_brackets(tmp_path: Path, llama_server_bin: Path, env: dict[str, str]) -> None:
    link = tmp_path / "[/]bin [x]" / "llama-server"
    link.parent.mkdir(parents=True)
    link.symlink_to(llama_server_bin)
    r = run("build", "--print-path", env=dict(env, FORGE_LLAMA_SERVER=str(link)))
    _ok(r)
    assert r.returncode == 0 and r.stdout.strip() == str(link), (r.stdout, r.stderr)


def test_service_install_with_brackets(tmp_path: Path, env: dict[str, str]) -> None:
    out = tmp_path / "[/]units [x]" / "forge.service"
    cfg = tmp_path / "[bold]cfg" / "forge.toml"
    r = run("service", "install", "--output", str(out), "--config", str(cfg), env=env)
    _ok(r)
    assert r.returncode == 0 and f"wrote {out}" in r.stdout and str(cfg) in r.stderr, (r.stdout, r.stderr)


@pytest.fixture
def bracket_service(tmp_path: Path, tiny_gguf: Path, llama_server_bin: Path) -> Iterator[Service]:
    model = tmp_path / "[/]m [x]" / "tiny.gguf"
    model.parent.mkdir(parents=True)
    shutil.copy(tiny_gguf, model)
    cfg = write_config(
        tmp_path / "forge.toml",
        f'[models.m]\npath = "{model}"\nctx_size = 256\ngpu = "cpu"\npreload = true\n',
    )
    with running_service(cfg, tmp_path / "svc-state", llama_server_bin) as svc:
        svc.model_path = model  # type: ignore[attr-defined]
        yield svc


def test_service_commands_echo_names_as_given(bracket_service: Service, env: dict[str, str]) -> None:
    """Names can't hold brackets (the config refuses them), but what a user types can, and
    llama-server's log lines name the bracketed model path."""
    env = dict(env, FORGE_STATE_DIR=str(bracket_service.state_dir))
    name = "m"
    r = run("ps", env=env)
    _ok(r)
    assert r.returncode == 0 and name in r.stdout, r.stdout
    r = run("logs", name, "--tail", "1000", env=env)
    _ok(r)
    assert r.returncode == 0 and str(bracket_service.model_path) in r.stdout, r.stdout[-2000:]  # type: ignore[attr-defined]
    r = run("load", name, env=env)
    _ok(r)
    assert r.returncode == 0 and r.stderr.strip().splitlines()[-1].startswith(f"{name}: ready"), r.stderr
    r = run("load", name, "-p", "Hi", "-n", "2", env=env)
    _ok(r)
    assert r.returncode == 0 and f"using {name} on the forge service" in r.stderr, r.stderr
    for cmd in ("unload", "logs"):
        r = run(cmd, "[/]nope", env=env)
        _ok(r)
        assert r.returncode == 2 and "[/]nope" in r.stderr, r.stderr
    r = run("unload", name, env=env)
    _ok(r)
    assert r.returncode == 0 and r.stderr.strip() == f"{name}: stopped", r.stderr
