"""A variant's length is one setting in any of its spellings (``max_tokens``, ``n_predict``…): the
gateway writes it in each route's own field, so a table that sets two is refused in one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from rocmforge_supervisor._errors import ConfigError
from rocmforge_supervisor.config import ForgeConfig, ForgeSettings, load_config


def _load(tmp_path: Path, variant: str) -> ForgeConfig:
    f = tmp_path / "forge.toml"
    f.write_text('[models.m]\npath = "m.gguf"\n[models.m.variants.v]\n' + variant)
    settings = ForgeSettings(config_home=tmp_path / "xdg", state_dir=tmp_path / "state")
    return load_config(f, settings, env={}, system_dir=tmp_path / "etc")


@pytest.mark.parametrize(
    "spelling", ["max_tokens", "n_predict", "max_completion_tokens", "max_output_tokens"]
)
def test_any_one_spelling_loads(tmp_path: Path, spelling: str) -> None:
    v = (
        _load(tmp_path, f"force = {{ {spelling} = 5 }}\ndefaults = {{ max_tokens = 9 }}\n")
        .models["m"]
        .variants["v"]
    )
    assert v.force == {spelling: 5} and v.defaults == {"max_tokens": 9}


@pytest.mark.parametrize("table", ["force", "defaults"])
def test_two_lengths_in_one_table_are_one_line_naming_both(tmp_path: Path, table: str) -> None:
    with pytest.raises(ConfigError) as err:
        _load(tmp_path, f"{table} = {{ max_tokens = 5, n_predict = 30 }}\n")
    message = str(err.value)
    assert "\n" not in message and message.startswith("config forge.toml: models.m"), message
    assert f"variant 'v' sets the answer's length twice in {table} (max_tokens, n_predict)" in message
    assert "keep one" in message
