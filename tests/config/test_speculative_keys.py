"""``draft``, ``draft_max``, ``draft_min``, ``draft_gpu``, ``speculative``, ``rerank`` and ``tools``:
what works together, and a one-line error naming the key and the fix for what does not — a flag in
``args`` that a key already sets among them."""

from __future__ import annotations

from pathlib import Path

import pytest

from rocmforge_supervisor._errors import ConfigError
from rocmforge_supervisor.config import ForgeConfig, ForgeSettings, load_config


def _load(tmp_path: Path, model: str) -> ForgeConfig:
    f = tmp_path / "forge.toml"
    f.write_text('[models.m]\npath = "m.gguf"\n' + model)
    settings = ForgeSettings(config_home=tmp_path / "xdg", state_dir=tmp_path / "state")
    return load_config(f, settings, env={}, system_dir=tmp_path / "etc")


def test_the_keys_that_work(tmp_path: Path) -> None:
    m = _load(
        tmp_path,
        'draft = "d.gguf"\ndraft_max = 16\ndraft_min = 4\ndraft_gpu = "cpu"\nspeculative = "ngram-mod, draft-simple"\n',
    ).models["m"]
    assert (m.draft, m.draft_max, m.draft_min, m.draft_gpu) == ("d.gguf", 16, 4, "cpu")
    assert _load(tmp_path, 'speculative = "ngram-simple"\n').models["m"].draft is None  # no model needed
    assert _load(tmp_path, 'speculative = "draft-mtp"\ndraft_max = 2\n').models["m"].draft_max == 2
    r = _load(tmp_path, "rerank = true\ntools = false\n").models["m"]
    assert r.rerank and r.tools is False
    # the old way keeps working: a draft through args alone
    assert (
        _load(tmp_path, 'args = ["-md", "d.gguf", "--spec-type", "draft-simple"]\n').models["m"].draft is None
    )


@pytest.mark.parametrize(
    ("keys", "words"),
    [
        ('speculative = "ngram-fast"\n', ["'ngram-fast'", "ngram-mod"]),
        ('speculative = "draft-simple"\n', ["needs a draft model", "draft = PATH"]),
        ("draft_max = 8\n", ["draft_max applies to a draft model", "remove draft_max"]),
        ('draft_gpu = "cpu"\n', ["draft_gpu places a draft model"]),
        ('draft = "d.gguf"\ndraft_max = 2\ndraft_min = 3\n', ["draft_min (3) is above draft_max (2)"]),
        ('draft = "d.gguf"\nrerank = true\n', ["rerank = true model generates no text"]),
        ("rerank = true\nembeddings = true\n", ["different poolings", "two models"]),
        (
            'draft = "d.gguf"\nargs = ["-md", "e.gguf"]\n',
            ["args has '-md', which the key draft already sets"],
        ),
        ('draft = "d.gguf"\nargs = ["--spec-draft-ngl=0"]\n', ["which the key draft_gpu already sets"]),
        ('speculative = "ngram-mod"\nargs = ["--spec_type", "none"]\n', ["the key speculative already sets"]),
        ('draft = "d.gguf"\ndraft_max = 4\nargs = ["--spec-draft-n-max", "9"]\n', ["the key draft_max"]),
        ('rerank = true\nargs = ["--reranking"]\n', ["'--reranking', which the key rerank already sets"]),
        ('backend = "whisper"\ndraft = "d.gguf"\n', ['draft does not apply to a backend = "whisper" model']),
    ],
)
def test_keys_that_cannot_work_are_one_line_errors(tmp_path: Path, keys: str, words: list[str]) -> None:
    with pytest.raises(ConfigError) as e:
        _load(tmp_path, keys)
    message = str(e.value)
    assert "models.m" in message and "\n" not in message.strip(), message
    for w in words:
        assert w in message, message


def test_tools_is_not_a_reason_to_restart_the_child(tmp_path: Path) -> None:
    a = _load(tmp_path, "")
    b = _load(tmp_path, "tools = false\n")
    assert a.model_fingerprint("m") == b.model_fingerprint("m")
    assert a.model_fingerprint("m") != _load(tmp_path, "rerank = true\n").model_fingerprint("m")
