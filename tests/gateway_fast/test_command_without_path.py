"""A ``backend = "command"`` model whose ``cmd`` does not pass ``${MODEL}`` needs no ``path``: it
loads, answers and is listed like any command (the command is the FAKE llama-server)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rocmforge_supervisor.config import load_config
from tests.gateway_fast.dialects import chat
from tests.hardware.conftest import FIXTURES, machine_settings
from tests.support.gateway import serving
from tests.support.supervised import fake_config

pytestmark = pytest.mark.anyio


async def test_a_command_without_path_serves(tmp_path: Path, tiny_gguf: Path, fake_bin: Path) -> None:
    cmd = [str(fake_bin), "--host", "${HOST}", "--port", "${PORT}"]
    fake_config(tmp_path, tiny_gguf, {"echo": {"backend": "command", "cmd": cmd}})
    toml = tmp_path / "forge.toml"
    lines = toml.read_text().splitlines()
    at = lines.index("[models.echo]")
    assert lines[at + 1].startswith("path = ")
    toml.write_text("\n".join(lines[: at + 1] + lines[at + 2 :]) + "\n")  # no path at all
    config = load_config(toml, machine_settings(FIXTURES / "no_gpu", state_dir=tmp_path / "state"), env={})
    assert config.models["echo"].path == ""

    async with serving(config, fake_bin) as gw:
        path, body = chat("openai", "echo", stream=False)
        r = await gw.client.post(path, json=body)
        assert r.status_code == 200, r.text
        rows = {m["name"]: m for m in (await gw.client.get("/api/models")).json()["models"]}
        assert rows["echo"]["state"] == "ready" and rows["echo"]["backend"] == "command", rows["echo"]
        assert [m["id"] for m in (await gw.client.get("/v1/models")).json()["data"]] == ["echo"]
