"""``forge serve --check-config`` (and ``forge serve`` itself) refuse a LoRA adapter made for
another base model, in one line naming the adapter's key and both files: llama-server would refuse
to start the model's child with it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.support.lora import write_lora
from tests.support.service import FORGE, write_config


def _section(name: str, model: Path, adapter: Path) -> str:
    return f'[models.{name}]\npath = "{model}"\n[models.{name}.adapters.tuned]\npath = "{adapter}"\n'


def _serve(args: list[str], config: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*FORGE, "serve", *args, "--config", str(config)], capture_output=True, text=True, env=env, timeout=60
    )


def test_an_adapter_for_another_model_is_refused_naming_both(
    tmp_path: Path, smollm2_path: Path, gemma_path: Path
) -> None:
    env = dict(os.environ, FORGE_STATE_DIR=str(tmp_path / "state"))
    smol_lora = write_lora(tmp_path / "smol-lora.gguf", smollm2_path)
    bad = write_config(tmp_path / "forge.toml", _section("g", gemma_path, smol_lora))
    for args in (["--check-config"], ["--port", "0"]):
        r = _serve(args, bad, env)
        assert r.returncode == 2, (r.stdout, r.stderr)
        (line,) = r.stderr.strip().splitlines()
        assert line.startswith("error: config forge.toml: models.g.adapters.tuned: smol-lora.gguf"), line
        assert gemma_path.name in line and "'llama' architecture, the model is 'gemma3'" in line, line
        assert "trained on this model" in line and "Traceback" not in line
    assert not (tmp_path / "state" / "service.json").exists()  # nothing was served

    wide = write_config(
        tmp_path / "wide.toml",
        _section("s", smollm2_path, write_lora(tmp_path / "wide.gguf", smollm2_path, embedding=640)),
    )
    (line,) = _serve(["--check-config"], wide, env).stderr.strip().splitlines()
    assert "models.s.adapters.tuned" in line and "embedding size is 576" in line, line

    missing = write_config(tmp_path / "missing.toml", _section("s", smollm2_path, tmp_path / "nope.gguf"))
    r = _serve(["--check-config"], missing, env)
    assert r.returncode == 2 and "nope.gguf does not exist" in r.stderr, r.stderr

    good = write_config(tmp_path / "ok.toml", _section("s", smollm2_path, smol_lora))
    r = _serve(["--check-config"], good, env)
    assert r.returncode == 0 and "config OK" in r.stderr, r.stderr
