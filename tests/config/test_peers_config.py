"""``[peers.NAME]`` and a model's ``fallback``: what a config may say, and one line naming the key
and the fix for each thing it may not (a loop over the table of bad values)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rocmforge_supervisor._errors import ConfigError
from rocmforge_supervisor.config import ForgeConfig, ForgeSettings, load_config

MODEL = '[models.a]\npath = "smollm2-135m"\n'


def _load(tmp_path: Path, text: str) -> ForgeConfig:
    f = tmp_path / "forge.toml"
    f.write_text(text)
    settings = ForgeSettings(config_home=tmp_path / "xdg", state_dir=tmp_path / "state")
    return load_config(f, settings, env={}, system_dir=tmp_path / "etc")


def test_a_peer_with_its_defaults(tmp_path: Path) -> None:
    cfg = _load(tmp_path, MODEL + '[peers.box]\nurl = "https://gpu-box:8443/v1/"\napi_key_env = "BOX_KEY"\n')
    peer = cfg.peers["box"]
    assert peer.url == "https://gpu-box:8443"  # /v1 is forge's to add
    assert peer.api == "openai" and peer.models == ["*"] and peer.discovers
    assert peer.timeouts.connect > 0 and peer.max_concurrency >= 1


def test_the_key_is_read_from_the_environment_never_stored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = _load(tmp_path, '[peers.box]\nurl = "https://gpu-box"\napi_key_env = "BOX_KEY"\n')
    monkeypatch.setenv("BOX_KEY", "s3cret")
    assert cfg.peers["box"].api_key() == "s3cret"
    assert "s3cret" not in cfg.model_dump_json()


def test_plain_http_is_allowed_to_loopback_or_when_insecure(tmp_path: Path) -> None:
    assert (
        _load(tmp_path, '[peers.p]\nurl = "http://127.0.0.1:8080"\n').peers["p"].url
        == "http://127.0.0.1:8080"
    )
    assert _load(tmp_path, '[peers.p]\nurl = "http://localhost:8080"\n').peers["p"]
    assert _load(tmp_path, '[peers.p]\nurl = "http://10.0.0.2:8080"\ninsecure = true\n').peers["p"].insecure


@pytest.mark.parametrize(
    ("text", "where", "words"),
    [
        ('[peers.p]\nurl = "http://10.0.0.2:8080"\n', "peers.p.url", "insecure = true"),
        ('[peers.p]\nurl = "ftp://box"\n', "peers.p.url", "http(s) URL"),
        ('[peers.p]\nurl = "https://box?x=1"\n', "peers.p.url", "no query"),
        ('[peers.p]\nurl = "https://box"\napi = "grpc"\n', "peers.p.api", "openai"),
        (
            '[peers.p]\nurl = "https://box"\napi_key_env = "not a name"\n',
            "peers.p.api_key_env",
            "environment variable",
        ),
        ('[peers.p]\nurl = "https://box"\nmodels = []\n', "peers.p.models", '["*"]'),
        ('[peers.p]\nurl = "https://box"\nmodels = ["*", "x"]\n', "peers.p.models", '"*" alone'),
        ('[peers.p]\nurl = "https://box"\nmax_concurrency = 0\n', "peers.p.max_concurrency", ""),
        ('[peers.p]\nurl = "https://box"\ntimeouts = { connect = 0 }\n', "peers.p.timeouts.connect", ""),
        ('[peers.p]\nurl = "https://box"\ncolour = "red"\n', "peers.p.colour", "unknown key"),
        ('[peers."a b"]\nurl = "https://box"\n', "peers.a b", "letters, digits"),
        (MODEL + 'fallback = ["nowhere/x"]\n', "models.a.fallback.0", "PEER/MODEL"),
        (MODEL + 'fallback = ["a"]\n', "models.a.fallback.0", "the model itself"),
        (
            MODEL + 'fallback = ["p/z"]\n[peers.p]\nurl = "https://box"\nmodels = ["y"]\n',
            "models.a.fallback.0",
            "serves only y",
        ),
        ('[models.x]\nbackend = "peer"\npath = "y"\n', "models.x.backend", "[peers.NAME]"),
    ],
)
def test_each_bad_value_is_one_line_naming_its_key(tmp_path: Path, text: str, where: str, words: str) -> None:
    with pytest.raises(ConfigError) as err:
        _load(tmp_path, text)
    message = str(err.value)
    assert "\n" not in message, message
    assert f": {where}: " in message, message
    assert words in message, message


def test_fallbacks_may_name_a_local_model_or_a_peers(tmp_path: Path) -> None:
    cfg = _load(
        tmp_path,
        MODEL
        + 'fallback = ["b", "p/anything", "q/y"]\n[models.b]\npath = "smollm2-135m"\n'
        + '[peers.p]\nurl = "https://box"\n[peers.q]\nurl = "https://box2"\nmodels = ["y"]\n',
    )
    assert cfg.models["a"].fallback == ["b", "p/anything", "q/y"]
    # The gateway's business: a fallback changes no child.
    plain = _load(tmp_path, MODEL)
    assert cfg.model_fingerprint("a") == plain.model_fingerprint("a")
