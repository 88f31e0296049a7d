"""``conf.d/*.toml`` beside the config file: merged in name order, a key set twice is an error
naming both files, an error in a key a conf.d file set names that file, relative paths are the
file's own."""

from __future__ import annotations

from pathlib import Path

import pytest

from rocmforge_supervisor._errors import ConfigError
from rocmforge_supervisor.config import ForgeSettings, config_files, load_config
from rocmforge_supervisor.service.ops._watch import snapshot


def _settings(tmp_path: Path) -> ForgeSettings:
    return ForgeSettings.model_construct(state_dir=tmp_path / "state", config_home=tmp_path / "home")


def _setup(tmp_path: Path, main: str, **parts: str) -> Path:
    (tmp_path / "conf.d").mkdir()
    for name, text in parts.items():
        (tmp_path / "conf.d" / f"{name}.toml").write_text(text)
    path = tmp_path / "forge.toml"
    path.write_text(main)
    return path


def test_conf_d_files_merge_into_the_file_in_name_order(tmp_path: Path) -> None:
    path = _setup(
        tmp_path,
        '[server]\nport = 9000\n[models.a]\npath = "a.gguf"\n',
        **{
            "20-b": '[models.b]\npath = "b.gguf"\n',
            "10-a-ttl": "[models.a]\nttl = 60\n",
            "30-groups": '[groups.chat]\nmembers = ["a", "b"]\nmax_loaded = 1\n',
        },
    )
    (tmp_path / "conf.d" / "notes.txt").write_text("not toml: ignored")
    cfg = load_config(path, _settings(tmp_path), env={})
    assert list(cfg.models) == ["a", "b"] and cfg.models["a"].ttl == 60 and cfg.server.port == 9000
    assert cfg.models["b"].path == str(tmp_path / "conf.d" / "b.gguf")  # relative to its own file
    assert cfg.group_of("b") == "chat"
    assert [p.name for p in config_files(path)] == [
        "forge.toml",
        "10-a-ttl.toml",
        "20-b.toml",
        "30-groups.toml",
    ]


def test_a_key_set_in_two_files_is_an_error_naming_both(tmp_path: Path) -> None:
    path = _setup(tmp_path, '[models.a]\npath = "a.gguf"\nttl = 5\n', **{"10-x": "[models.a]\nttl = 60\n"})
    with pytest.raises(ConfigError) as err:
        load_config(path, _settings(tmp_path), env={})
    text = str(err.value)
    assert "models.a.ttl is set in both" in text and "forge.toml" in text and "10-x.toml" in text
    assert "\n" not in text


def test_an_invalid_key_in_a_conf_d_file_names_that_file(tmp_path: Path) -> None:
    path = _setup(
        tmp_path, '[models.a]\npath = "a.gguf"\n', **{"10-b": '[models.b]\npath = "b.gguf"\nctx_sise = 1\n'}
    )
    with pytest.raises(ConfigError) as err:
        load_config(path, _settings(tmp_path), env={})
    assert "10-b.toml" in str(err.value) and "models.b.ctx_sise" in str(err.value)
    assert "did you mean 'ctx_size'" in str(err.value)


def test_the_watch_snapshot_sees_edits_renames_symlink_swaps_and_conf_d_changes(tmp_path: Path) -> None:
    # Kubernetes' ConfigMap layout: forge.toml -> ..data/forge.toml, ..data -> ..2026_v1
    v1, v2 = tmp_path / "..v1", tmp_path / "..v2"
    v1.mkdir()
    v2.mkdir()
    (v1 / "forge.toml").write_text("[server]\nport = 1\n")
    (v2 / "forge.toml").write_text("[server]\nport = 2\n")
    (tmp_path / "..data").symlink_to(v1.name)
    path = tmp_path / "forge.toml"
    path.symlink_to("..data/forge.toml")
    first = snapshot(path)
    assert snapshot(path) == first  # nothing changed: the same look
    tmp = tmp_path / "..data_tmp"
    tmp.symlink_to(v2.name)
    tmp.rename(tmp_path / "..data")  # the atomic swap kubelet does
    swapped = snapshot(path)
    assert swapped != first
    conf_d = tmp_path / "conf.d"
    conf_d.mkdir()
    (conf_d / "10-x.toml").write_text("[models.x]\npath='x.gguf'\n")
    added = snapshot(path)
    assert len(added) == 2 and added != swapped
    # An editor that writes a new file and renames it over the old one: same size, new content.
    new = conf_d / ".10-x.toml.swp"
    new.write_text("[models.x]\npath='y.gguf'\n")
    new.rename(conf_d / "10-x.toml")
    assert snapshot(path) != added
    (conf_d / "10-x.toml").unlink()
    assert snapshot(path) == {k: v for k, v in swapped.items()}
