"""``forge plan``: a three-model config placed on a fixture GPU machine (one RX 7900 XTX, read from
its sysfs tree) and this machine's RAM, as a table and as JSON, without starting anything: the
``auto`` context chosen, a group's rule, the start's preload, a model that fits nowhere with the
changes that would make it fit, and a model not downloaded yet."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.hardware.conftest import FIXTURES

FORGE = [sys.executable, "-m", "rocmforge_supervisor.cli"]


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    machine = FIXTURES / "rx7900xtx"
    e = dict(os.environ, COLUMNS="250", NO_COLOR="1", XDG_CONFIG_HOME=str(tmp_path / "xdg"))
    e.update(
        FORGE_STATE_DIR=str(tmp_path / "state"),
        FORGE_SYSFS_ROOT=str(machine / "sys"),
        FORGE_DEV_ROOT=str(machine / "dev"),
        FORGE_USE_AMDSMI="0",
        FORGE_USE_NVML="0",
        FORGE_ENABLE_IGPU="0",
        FORGE_HF_OFFLINE="1",
    )
    for k in ("ROCR_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "FORGE_API_KEY"):
        e.pop(k, None)
    return e


@pytest.fixture
def config(tmp_path: Path, smollm2_path: Path, gemma_path: Path) -> Path:
    path = tmp_path / "forge.toml"
    path.write_text(
        f"""
[models.chat]
path = "{smollm2_path}"
ctx_size = "auto"
preload = true

[models.base]
path = "{gemma_path}"
ctx_size = 8192
parallel = 2

[models.long]
path = "{smollm2_path}"
ctx_size = 1500000
parallel = 1

[models.later]
path = "hf:nobody/not-downloaded-GGUF:Q4_K_M"

[groups.chat]
members = ["chat", "base"]
max_loaded = 1
"""
    )
    return path


def _plan(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*FORGE, "plan", *args], capture_output=True, text=True, env=env, timeout=120)


def test_plan_json(env: dict[str, str], config: Path) -> None:
    r = _plan(env, "--config", str(config), "--json")
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    assert plan["config"] == str(config) and plan["start_from"] == "start"
    assert [d["key"] for d in plan["devices"]] == ["amd:0", "cpu"]
    rows = {m["name"]: m for m in plan["models"]}
    assert list(rows) == ["chat", "base", "long", "later"]
    assert plan["loaded"] == ["chat"] and rows["chat"]["state"] == "at start"
    chat = rows["chat"]
    assert chat["devices"] == ["amd:0"]
    assert chat["context"]["limit"] == "trained" and chat["ctx_per_request"] == 8192  # SmolLM2's trained
    for part in ("weights_bytes", "kv_bytes", "compute_bytes", "output_bytes", "projector_bytes"):
        assert part in chat["estimate"]
    assert chat["estimate"]["context_bytes"] > 0  # the GPU backend's own context
    base = rows["base"]
    assert base["state"] == "on request" and base["evict"] == ["chat"]  # the group holds one
    assert base["evict_rules"]["chat"] == "group 'chat' has max_loaded = 1"
    assert base["ctx_size"] == 8192 and base["context"] is None
    long = rows["long"]
    assert long["state"] == "does not fit" and long["fits_alone"] is False
    keys = {a["key"] for a in long["advice"]}
    assert "ctx_size" in keys and "args" in keys  # a smaller context, an 8-bit KV cache
    assert (
        rows["later"]["state"] == "not planned" and "not in the Hugging Face cache" in rows["later"]["error"]
    )
    kinds = {t["kind"]: t for t in plan["cannot_load_together"]}
    assert kinds["group"]["models"] == ["chat", "base"]


def test_plan_text(env: dict[str, str], config: Path) -> None:
    r = _plan(env, "--config", str(config))
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert f"config {config} on amd:0 (AMD Radeon RX 7900 XTX)" in out
    assert "at the start: chat" in out
    for header in ("model", "state", "ctx/request", "weights", "KV", "compute", "total", "unloads"):
        assert header in out
    assert (
        "cannot be loaded together:" in out and "group 'chat': at most 1 of chat, base loaded at once" in out
    )
    assert "chat: ctx_size auto: 8192 tokens per request, its trained context (ctx_min 2048)" in out
    assert "long: long (Q4_1, ctx 1500160) does not fit" in out
    assert "  it would fit with: ctx_size = " in out and "-ctk" in out
    assert "later: nobody/not-downloaded-GGUF:Q4_K_M is not in the Hugging Face cache" in out
    assert "(a plan never downloads) — forge pull nobody/not-downloaded-GGUF:Q4_K_M downloads it" in out
    assert psutil.Process().children(recursive=True) == []  # nothing was started


def test_a_bad_config_is_one_line(env: dict[str, str], tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[models.m]\npath = "x.gguf"\nctx_size = "huge"\n')
    r = _plan(env, "--config", str(bad))
    assert r.returncode == 2
    assert r.stderr.startswith(
        "error: config bad.toml: models.m.ctx_size: 'huge' is not a context size: use a number of tokens"
    ), r.stderr
    assert r.stderr.count("\n") == 1


def test_inspect_and_ps_say_auto(env: dict[str, str], config: Path) -> None:
    """``forge inspect NAME`` of an auto model estimates at its trained context and says so; ``forge
    ps`` shows a chosen context as ``N auto``, and ``auto`` before the first load."""
    from rocmforge_supervisor.cli._serve import _context

    r = subprocess.run(
        [*FORGE, "inspect", "chat", "--config", str(config)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert "estimate: ctx 8,192" in r.stdout
    assert 'ctx_size = "auto": estimated at the trained context, the most it may choose' in r.stderr
    auto = {"ctx_size": 5376, "limit": "memory"}
    shared = {"per_request": 5376, "parallel": 4, "kv_unified": True, "auto": auto}
    assert _context({"context": shared}) == "5376 (4 slots share it) auto"
    assert _context({"context": {"per_request": None, "parallel": 4, "auto": {"ctx_min": 2048}}}) == "auto"
    assert _context({"context": {"per_request": None, "parallel": 4}}) == "trained"
