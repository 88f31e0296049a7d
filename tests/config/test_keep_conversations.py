"""``keep_conversations`` works through ``keep_context``'s saved slots: alone it is an error that
says so and how to fix it, not a key that silently does nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from rocmforge_supervisor._errors import ConfigError
from rocmforge_supervisor.config import ForgeSettings, load_config


def _load(tmp_path: Path, keys: str) -> object:
    path = tmp_path / "forge.toml"
    path.write_text(f'[models.m]\npath = "m.gguf"\n{keys}')
    settings = ForgeSettings.model_construct(state_dir=tmp_path / "state", config_home=tmp_path / "home")
    return load_config(path, settings, env={})


def test_keep_conversations_without_keep_context_is_one_line_naming_the_fix(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        _load(tmp_path, "keep_conversations = true\n")
    text = str(err.value)
    assert "keep_conversations = true needs keep_context = true" in text and "models.m" in text
    assert "\n" not in text


def test_with_keep_context_it_loads(tmp_path: Path) -> None:
    _load(tmp_path, "keep_context = true\nkeep_conversations = true\n")
