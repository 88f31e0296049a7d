"""[[server.keys]]: every bad entry is one config error naming the entry; keys are found in
constant time and never shown; model globs; the per-minute and per-day limits."""

from __future__ import annotations

from pathlib import Path

import pytest

from rocmforge_supervisor._errors import ConfigError, KeyForbidden, RateLimited
from rocmforge_supervisor.access import ADMIN_KEY_NAME, Key, KeyRing, Limiter
from rocmforge_supervisor.config import ForgeSettings, load_config


def _load(tmp_path: Path, text: str) -> KeyRing:
    path = tmp_path / "forge.toml"
    path.write_text(text)
    cfg = load_config(path, ForgeSettings(config_home=tmp_path / "xdg", state_dir=tmp_path / "state"))
    return KeyRing.from_config(cfg.server)


def test_keys_from_key_key_file_and_env_with_api_key_as_an_admin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "ops.key").write_text("sk-ops\n")
    monkeypatch.setenv("CI_FORGE_KEY", "sk-ci")
    ring = _load(
        tmp_path,
        f"""
[server]
api_key = "sk-admin"
[[server.keys]]
name = "web"
key = "sk-web"
models = ["chat", "qwen*"]
requests_per_minute = 10
[[server.keys]]
name = "ops"
key_file = "{tmp_path / "ops.key"}"
admin = true
[[server.keys]]
name = "ci"
env = "CI_FORGE_KEY"
tokens_per_day = 1000
""",
    )
    found = {t: ring.identify(t.encode()) for t in ("sk-admin", "sk-web", "sk-ops", "sk-ci", "sk-nope", "")}
    assert {t: k.name if k else None for t, k in found.items()} == {
        "sk-admin": ADMIN_KEY_NAME,
        "sk-web": "web",
        "sk-ops": "ops",
        "sk-ci": "ci",
        "sk-nope": None,
        "": None,
    }
    web = found["sk-web"]
    assert web is not None and not web.admin and web.requests_per_minute == 10
    assert web.may_use("chat") and web.may_use("qwen3-8b") and not web.may_use("gemma")
    assert "sk-web" not in repr(web)
    with pytest.raises(KeyForbidden) as no:
        web.check_model("gemma")
    assert "'web'" in str(no.value) and "'gemma'" in str(no.value) and "sk-web" not in str(no.value)
    assert found["sk-ops"] is not None and found["sk-ops"].admin


@pytest.mark.parametrize(
    ("entry", "says"),
    [
        (
            'name = "a"\nkey = "k1"\n[[server.keys]]\nname = "a"\nkey = "k2"',
            "entry 'a': the name 'a' is used twice",
        ),
        (
            'name = "a"\nkey = "k1"\n[[server.keys]]\nname = "b"\nkey = "k1"',
            "entry 'b': its key is the same as 'a'",
        ),
        ('name = "a"\nkey = "sk-admin"', "entry 'a': its key is the same as 'api_key'"),
        ('name = "a"\nkey = "k1"\nmodels = []', "entry 'a': models is empty"),
        ('name = "a"\nkey = "k1"\nrequests_per_minute = 0', "entry 'a': requests_per_minute must be above 0"),
        ('name = "a"\nkey = "k1"\ntokens_per_day = -5', "entry 'a': tokens_per_day must be above 0"),
        ('name = "a"', "entry 'a' needs exactly one of key, key_file or env"),
        ('name = "a"\nkey = "k1"\nenv = "X"', "(it has key, env)"),
        (
            'name = "a"\nenv = "FORGE_TEST_UNSET_KEY"',
            "entry 'a': the environment variable FORGE_TEST_UNSET_KEY is not set",
        ),
        (
            'name = "a"\nkey_file = "/nonexistent/forge.key"',
            "entry 'a': key_file '/nonexistent/forge.key' cannot be read",
        ),
        (
            'name = "a"\nkey = "k1"\nmodel = ["x"]',
            "server.keys.0.model: unknown key — did you mean 'models'?",
        ),
    ],
)
def test_a_bad_entry_is_one_config_error_naming_it(tmp_path: Path, entry: str, says: str) -> None:
    with pytest.raises(ConfigError) as err:
        _load(tmp_path, f'[server]\napi_key = "sk-admin"\n[[server.keys]]\n{entry}\n')
    assert says in str(err.value)
    assert "k1" not in str(err.value) and "sk-admin" not in str(err.value)  # never the key


def test_identify_compares_with_every_key() -> None:
    """Constant time: the scan does not stop at the match (which key matched tells nothing)."""
    compared: list[bytes] = []
    ring = KeyRing([Key("a", b"ka"), Key("b", b"kb"), Key("c", b"kc")])
    import hmac

    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        compared.append(b)
        return real(a, b)

    hmac.compare_digest = spy  # type: ignore[assignment]
    try:
        assert ring.identify(b"ka") is ring.keys[0]
    finally:
        hmac.compare_digest = real
    assert compared == [b"ka", b"kb", b"kc"]


def test_requests_per_minute_is_a_sliding_window_with_retry_after() -> None:
    now = [1000.0]
    limiter = Limiter(clock=lambda: now[0])
    key = Key("ci", b"k", requests_per_minute=2)
    limiter.admit(key)
    now[0] += 10
    limiter.admit(key)
    with pytest.raises(RateLimited) as over:
        limiter.admit(key)
    assert over.value.retry_after == pytest.approx(50.0) and "'ci'" in str(over.value)
    now[0] += 50.0  # the first request has aged out
    limiter.admit(key)
    with pytest.raises(RateLimited):
        limiter.admit(key)


def test_tokens_per_day_counts_finished_requests_and_restarts_from_the_log() -> None:
    now = [0.0]
    limiter = Limiter(clock=lambda: now[0])
    key = Key("ci", b"k", tokens_per_day=100)
    limiter.admit(key)
    limiter.add_tokens("ci", 100)
    with pytest.raises(RateLimited) as over:
        limiter.admit(key)
    assert over.value.retry_after == pytest.approx(86400.0)
    now[0] = 86400.5  # a day later the tokens have aged out
    limiter.admit(key)

    seeded = Limiter(clock=lambda: 10.0)
    seeded.seed({"ci": [(5.0, 60), (6.0, 40)]})  # what the activity log says of the last day
    with pytest.raises(RateLimited):
        seeded.admit(key)
