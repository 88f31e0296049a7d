"""``[server] tls_cert`` / ``tls_key``: both or neither, both readable, a PEM certificate and its
own unencrypted key — each wrong pair refused when the config is read, in one line naming the key."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from rocmforge_supervisor._errors import ConfigError
from rocmforge_supervisor.config import ForgeConfig, ForgeSettings, load_config
from tests.support.service import FORGE
from tests.support.tls import self_signed


def _load(tmp_path: Path, server: str) -> ForgeConfig:
    path = tmp_path / "forge.toml"
    path.write_text("[server]\n" + server)
    return load_config(path, ForgeSettings.model_construct(), env={})


def test_a_pair_loads_and_relative_paths_are_next_to_the_file(tmp_path: Path) -> None:
    self_signed(tmp_path / "tls")
    cfg = _load(tmp_path, 'tls_cert = "tls/forge.crt"\ntls_key = "tls/forge.key"\n')
    server = cfg.server
    assert (
        server.tls_cert == tmp_path / "tls" / "forge.crt" and server.tls_key == tmp_path / "tls" / "forge.key"
    )
    assert server.tls and server.scheme == "https"
    assert not _load(tmp_path, "").server.tls


@pytest.mark.parametrize(
    ("server", "key", "needle"),
    [
        ('tls_cert = "tls/forge.crt"\n', "server.tls_key", "tls_cert is set but tls_key is not"),
        ('tls_key = "tls/forge.key"\n', "server.tls_cert", "tls_key is set but tls_cert is not"),
        ('tls_cert = "tls/nope.crt"\ntls_key = "tls/forge.key"\n', "server.tls_cert", "cannot be read"),
        (
            'tls_cert = "tls/forge.crt"\ntls_key = "tls/other.key"\n',
            "server.tls_key",
            "is not the private key",
        ),
        (
            'tls_cert = "tls/forge.key"\ntls_key = "tls/forge.key"\n',
            "server.tls_cert",
            "holds no PEM certificate",
        ),
        (
            'tls_cert = "tls/forge.crt"\ntls_key = "tls/forge.crt"\n',
            "server.tls_key",
            "holds no PEM private key",
        ),
    ],
)
def test_a_wrong_pair_is_one_line_naming_the_key(tmp_path: Path, server: str, key: str, needle: str) -> None:
    self_signed(tmp_path / "tls")
    self_signed(tmp_path / "tls", "other")
    with pytest.raises(ConfigError) as e:
        _load(tmp_path, server)
    assert e.value.key == key and needle in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_an_encrypted_key_is_refused_without_a_prompt(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path / "tls")
    locked = tmp_path / "tls" / "locked.key"
    subprocess.run(
        ["openssl", "pkey", "-in", str(key), "-out", str(locked), "-aes256", "-passout", "pass:secret"],
        check=True,
        timeout=30,
        stdin=subprocess.DEVNULL,
    )
    with pytest.raises(ConfigError, match="is encrypted"):
        _load(tmp_path, f'tls_cert = "{cert}"\ntls_key = "{locked}"\n')


def test_check_config_refuses_half_a_pair(tmp_path: Path) -> None:
    cert, _ = self_signed(tmp_path / "tls")
    cfg = tmp_path / "forge.toml"
    cfg.write_text(f'[server]\ntls_cert = "{cert}"\n')
    env = dict(os.environ, FORGE_STATE_DIR=str(tmp_path / "state"))
    r = subprocess.run(
        [*FORGE, "serve", "--check-config", "--config", str(cfg)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert r.returncode == 2, r.stderr
    assert "server.tls_key: tls_cert is set but tls_key is not" in r.stderr and "Traceback" not in r.stderr
