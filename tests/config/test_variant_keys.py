"""``[models.X.variants.Y]`` and ``[models.X.adapters.NAME]``: what loads, and a one-line error
naming the section and the fix for a name that could not be served as ``X:NAME``."""

from __future__ import annotations

from pathlib import Path

import pytest

from rocmforge_supervisor._errors import ConfigError
from rocmforge_supervisor.config import ForgeConfig, ForgeSettings, load_config


def _load(tmp_path: Path, sections: str, model: str = "") -> ForgeConfig:
    f = tmp_path / "forge.toml"
    f.write_text('[models.m]\npath = "m.gguf"\n' + model + sections)
    settings = ForgeSettings(config_home=tmp_path / "xdg", state_dir=tmp_path / "state")
    return load_config(f, settings, env={}, system_dir=tmp_path / "etc")


def test_variants_and_adapters_load(tmp_path: Path) -> None:
    m = _load(
        tmp_path,
        '[models.m.variants.json]\ndefaults = {temperature = 0.2}\nforce = {response_format = {type = "json_object"}}\n'
        'strip = ["top_p"]\nsystem = "Answer in JSON."\nadapter = "tuned"\n'
        '[models.m.adapters.tuned]\npath = "t.gguf"\nscale = 0.5\n',
    ).models["m"]
    v = m.variants["json"]
    assert v.defaults == {"temperature": 0.2} and v.force == {"response_format": {"type": "json_object"}}
    assert (v.strip, v.system, v.adapter) == (["top_p"], "Answer in JSON.", "tuned")
    assert (m.adapters["tuned"].path, m.adapters["tuned"].scale) == ("t.gguf", 0.5)


def test_a_variant_does_not_change_the_fingerprint_an_adapter_does(tmp_path: Path) -> None:
    base = _load(tmp_path, "").model_fingerprint("m")
    assert _load(tmp_path, '[models.m.variants.v]\nsystem = "x"\n').model_fingerprint("m") == base
    assert _load(tmp_path, '[models.m.adapters.a]\npath = "a.gguf"\n').model_fingerprint("m") != base


@pytest.mark.parametrize(
    ("sections", "model", "words"),
    [
        ('[models.m.variants."a:b"]\n', "", ["'a:b'", "no ':'"]),
        ("[models.m.variants.latest]\n", "", ["'latest'", "Ollama"]),
        (
            '[models.m.variants.t]\n[models.m.adapters.t]\npath = "t.gguf"\n',
            "",
            ["both a variant and an adapter", 'adapter = "t"'],
        ),
        ('[models.m.variants.v]\nadapter = "nope"\n', "", ["'nope'", "adapters: none"]),
        ('[models.m.adapters.a]\npath = "a,b.gguf"\n', "", ["','", "--lora-scaled"]),
        ('[models.m.adapters.a]\npath = "C:a.gguf"\n', "", ["':'", "--lora-scaled"]),
        (
            '[models.m.adapters.a]\npath = "a.gguf"\n',
            'args = ["--lora", "x.gguf"]\n',
            ["'--lora'", "remove it"],
        ),
        (
            '[models.m.adapters.a]\npath = "a.gguf"\n',
            'backend = "command"\ncmd = ["x", "${PORT}"]\n',
            ["adapters does not apply", 'backend = "command"'],
        ),
        ("[models.m.variants.v]\ntemprature = 1\n", "", ["temprature"]),
    ],
)
def test_a_name_that_cannot_be_served_is_one_line_naming_the_fix(
    tmp_path: Path, sections: str, model: str, words: list[str]
) -> None:
    with pytest.raises(ConfigError) as err:
        _load(tmp_path, sections, model)
    message = str(err.value)
    assert "\n" not in message, message
    for w in words:
        assert w in message, (w, message)
