"""``forge serve --check-config`` (and ``forge serve`` itself) refuse a draft whose vocabulary is
not the model's, in one line naming the key: llama-server would load it and serve without drafting."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.support.service import FORGE, model_section, write_config


def test_gemma_cannot_draft_for_smollm2(tmp_path: Path, smollm2_path: Path, gemma_path: Path) -> None:
    env = dict(os.environ, FORGE_STATE_DIR=str(tmp_path / "state"))
    bad = write_config(tmp_path / "forge.toml", model_section("chat", smollm2_path, draft=str(gemma_path)))
    for args in (["--check-config"], ["--port", "0"]):
        r = subprocess.run(
            [*FORGE, "serve", *args, "--config", str(bad)],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        assert r.returncode == 2, (r.stdout, r.stderr)
        (line,) = r.stderr.strip().splitlines()
        assert line.startswith("error: config forge.toml: models.chat.draft: gemma-3-270m-q4_k_m.gguf"), line
        assert "does not share the vocabulary" in line and "'llama'" in line and "'gpt2'" in line
        assert "same family" in line and "Traceback" not in line
    assert not (tmp_path / "state" / "service.json").exists()  # nothing was served
    good = write_config(tmp_path / "ok.toml", model_section("chat", smollm2_path, draft=str(smollm2_path)))
    r = subprocess.run(
        [*FORGE, "serve", "--check-config", "--config", str(good)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert r.returncode == 0 and "config OK" in r.stderr, r.stderr


def test_a_misspelt_embedded_draft_is_a_config_error(tmp_path: Path, smollm2_path: Path) -> None:
    env = dict(os.environ, FORGE_STATE_DIR=str(tmp_path / "state"))
    cfg = write_config(tmp_path / "forge.toml", model_section("chat", smollm2_path, draft="smolm2-135m"))
    r = subprocess.run(
        [*FORGE, "serve", "--check-config", "--config", str(cfg)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert r.returncode == 2, r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("error: config forge.toml: models.chat.draft: 'smolm2-135m' is not an embedded"), (
        line
    )
    assert "did you mean 'smollm2-135m'?" in line
