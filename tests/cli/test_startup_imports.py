"""The light commands import only what they use: a guard for start-up time, not a timed test.

``forge --help``, ``forge ps`` and ``forge gpus --json`` took ~0.8 s because every command module
imported everything (the gateway, httpx, anyio, gguf and numpy) at start-up. The timings live in
the issue's measurements (``/usr/bin/time``, medians); this test checks what those timings rest on,
the modules that each command's path imports, in a fresh interpreter running the real command.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# Runs the real entry point, then writes the loaded module names: atexit, because the command
# ends with SystemExit (typer's and forge's own), which must not be caught here to look at them.
_PROBE = """
import atexit, json, sys
out, args = sys.argv[1], sys.argv[2:]
atexit.register(lambda: open(out, "w").write(json.dumps(sorted(sys.modules))))
sys.argv = ["forge", *args]
from rocmforge_supervisor.cli.main import main
main()
"""

#: The gateway and the model-file stack: no light command needs any of them.
_SERVER_AND_MODELS = {"uvicorn", "starlette", "prometheus_client", "numpy", "gguf", "huggingface_hub"}
#: Talking to llama-server or a service: only when there is one to talk to.
_CLIENTS = {"httpx", "anyio"}


def _loaded(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    out = tmp_path / "modules.json"
    env = dict(
        os.environ,
        FORGE_STATE_DIR=str(tmp_path / "state"),  # no service.json here: no service is running
        XDG_CONFIG_HOME=str(tmp_path / "config"),  # no forge.toml: the defaults
        COLUMNS="120",
        NO_COLOR="1",
    )
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE, str(out), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    return proc, set(json.loads(out.read_text()))


def _top(modules: set[str]) -> set[str]:
    return {m.split(".")[0] for m in modules}


def test_help_imports_no_settings_clients_server_or_model_stack(tmp_path: Path) -> None:
    proc, modules = _loaded(tmp_path, "--help")
    assert proc.returncode == 0, proc.stderr
    assert "forge" in proc.stdout and "ps" in proc.stdout
    heavy = _SERVER_AND_MODELS | _CLIENTS | {"pydantic_settings", "psutil", "filelock"}
    assert _top(modules) & heavy == set()
    # The service package is only named (lazily), its server never imported.
    assert (
        not {"rocmforge_supervisor.service.ops._server", "rocmforge_supervisor.service.ops._client"} & modules
    )


def test_ps_without_a_service_imports_no_client_server_or_model_stack(tmp_path: Path) -> None:
    """``ps`` reads the settings and the config (pydantic-settings: that is where the state dir
    comes from) and looks for ``service.json``; with none there, nothing talks HTTP."""
    proc, modules = _loaded(tmp_path, "ps")
    assert proc.returncode == 1, proc.stderr
    assert "no forge service is running" in proc.stderr
    assert "pydantic_settings" in _top(modules)  # the same settings as every other command
    assert _top(modules) & (_SERVER_AND_MODELS | _CLIENTS | {"psutil"}) == set()
    assert "rocmforge_supervisor.supervisor" not in modules


def test_gpus_json_imports_no_client_server_or_model_stack(tmp_path: Path) -> None:
    proc, modules = _loaded(tmp_path, "gpus", "--json")
    assert proc.returncode == 0, proc.stderr
    assert any(d["vendor"] == "cpu" for d in json.loads(proc.stdout)["devices"])
    assert _top(modules) & (_SERVER_AND_MODELS | _CLIENTS) == set()
    assert not {"rocmforge_supervisor.supervisor", "rocmforge_supervisor.binaries._builder"} & modules


@pytest.mark.parametrize(
    ("name", "module"),
    [
        ("TextModel", "rocmforge_supervisor.client._textmodel"),
        ("load_model", "rocmforge_supervisor.supervisor._local"),
    ],
)
def test_the_public_api_still_imports_on_first_use(name: str, module: str) -> None:
    code = (
        f"import sys, rocmforge_supervisor as r; assert {module!r} not in sys.modules; "
        f"from rocmforge_supervisor import {name}; print({name}.__module__)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == module
