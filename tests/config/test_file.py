"""forge.toml: the keys written today keep working, every bad value names its key, env beats file."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import SecretStr

from rocmforge_supervisor._errors import ConfigError
from rocmforge_supervisor.config import (
    ForgeConfig,
    ForgeSettings,
    ModelConfig,
    ServerConfig,
    SupervisorConfig,
    load_config,
)

FULL = """\
[server]
host = "127.0.0.1"
port = 8081
api_key = "sekrit"
allow_unauthenticated = false
cors_origins = ["http://localhost:3000"]
max_body_bytes = 1048576
log_format = "json"
state_dir = "/var/lib/rocmforge"
log_dir = "logs"
model_dirs = ["/models", "~/gguf"]

[supervisor]
restart_backoff_initial = 0.5
restart_backoff_max = 30.0
crash_loop_max = 3
crash_loop_window = 120.0
health_interval = 2.5
health_failures = 4
load_stall_timeout = 200.0
stop_timeout = 5.0
drain_timeout = 15.0

[models.gemma]
path = "gemma-3-270m"
ctx_size = 4096
gpu_layers = "auto"
parallel = 4
gpu = "auto"
preload = true
ttl = 300
max_concurrency = 8
queue = 32
args = ["--flash-attn", "on"]

[models.local-q4]
path = "models/x.gguf"
gpu_layers = 20
gpu = [0, 1]

[models."hub.model_2"]
path = "hf:org/repo:Q4_K_M"
gpu = "cpu"
gpu_layers = "all"
"""


@pytest.fixture
def settings(tmp_path: Path) -> ForgeSettings:
    return ForgeSettings(config_home=tmp_path / "xdg" / "rocmforge", state_dir=tmp_path / "state")


@pytest.fixture
def etc(tmp_path: Path) -> Path:
    d = tmp_path / "etc" / "rocmforge"
    d.mkdir(parents=True)
    return d


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def load(
    path: Path | None, settings: ForgeSettings, etc: Path, env: dict[str, str] | None = None
) -> ForgeConfig:
    return load_config(path, settings, env=env or {}, system_dir=etc)


def test_full_file_round_trip(tmp_path: Path, settings: ForgeSettings, etc: Path) -> None:
    f = write(tmp_path / "conf" / "forge.toml", FULL)
    c = load(f, settings, etc)
    assert c.source == f
    s = c.server
    assert (s.host, s.port, s.allow_unauthenticated, s.log_format) == ("127.0.0.1", 8081, False, "json")
    assert isinstance(s.api_key, SecretStr) and s.api_key.get_secret_value() == "sekrit"
    assert "sekrit" not in repr(c)
    assert s.cors_origins == ["http://localhost:3000"]
    assert s.max_body_bytes == 1048576
    assert c.state_dir == Path("/var/lib/rocmforge")
    assert c.log_dir == f.parent / "logs"  # relative to the file, not the cwd
    assert s.model_dirs == [Path("/models"), Path.home() / "gguf"]
    assert c.supervisor == SupervisorConfig(
        restart_backoff_initial=0.5,
        restart_backoff_max=30.0,
        crash_loop_max=3,
        crash_loop_window=120.0,
        health_interval=2.5,
        health_failures=4,
        load_stall_timeout=200.0,
        stop_timeout=5.0,
        drain_timeout=15.0,
    )
    g = c.models["gemma"]
    assert g == ModelConfig(
        path="gemma-3-270m",
        ctx_size=4096,
        gpu_layers="auto",
        parallel=4,
        gpu="auto",
        preload=True,
        ttl=300,
        max_concurrency=8,
        queue=32,
        args=["--flash-attn", "on"],
    )
    assert g.effective_max_concurrency == 8
    local = c.models["local-q4"]
    assert local.path == str(f.parent / "models" / "x.gguf")
    assert (local.gpu_layers, local.gpu, local.preload, local.ttl, local.queue) == (20, [0, 1], False, 0, 64)
    assert local.effective_max_concurrency == 4
    hub = c.models["hub.model_2"]
    assert (hub.path, hub.gpu, hub.gpu_layers) == ("hf:org/repo:Q4_K_M", "cpu", "all")


def test_defaults_without_any_file(settings: ForgeSettings, etc: Path) -> None:
    c = load(None, settings, etc)
    assert c.source is None
    assert c.server == ServerConfig()
    assert (c.server.host, c.server.port, c.server.api_key, c.server.log_format) == (
        "127.0.0.1",
        8080,
        None,
        "text",
    )
    assert c.server.max_body_bytes == 16 * 1024 * 1024
    assert c.server.cors_origins == [] and c.server.model_dirs == []
    assert c.supervisor == SupervisorConfig()
    assert (c.supervisor.health_interval, c.supervisor.crash_loop_max) == (5.0, 5)
    assert c.models == {}
    assert c.state_dir == settings.state_dir
    assert c.log_dir == settings.state_dir / "logs"


def test_empty_file_is_valid(tmp_path: Path, settings: ForgeSettings, etc: Path) -> None:
    c = load(write(tmp_path / "forge.toml", ""), settings, etc)
    assert c.models == {} and c.server.port == 8080


def test_effective_max_concurrency_falls_back_to_parallel() -> None:
    assert ModelConfig(path="x", parallel=2).effective_max_concurrency == 2
    assert ModelConfig(path="x", parallel=2, max_concurrency=6).effective_max_concurrency == 6
    assert ModelConfig(path="x").effective_max_concurrency == 4


# -- where the file comes from --------------------------------------------------------------------


def test_search_order(tmp_path: Path, settings: ForgeSettings, etc: Path) -> None:
    explicit = write(tmp_path / "mine.toml", "[server]\nport = 1001\n")
    xdg = settings.config_home / "forge.toml"
    system = etc / "forge.toml"
    write(system, "[server]\nport = 1003\n")
    assert load(None, settings, etc).server.port == 1003
    assert load(None, settings, etc).source == system
    write(xdg, "[server]\nport = 1002\n")
    assert load(None, settings, etc).server.port == 1002
    assert load(None, settings, etc).source == xdg
    assert load(explicit, settings, etc).server.port == 1001
    assert load(explicit, settings, etc).source == explicit


def test_missing_explicit_config_is_an_error(tmp_path: Path, settings: ForgeSettings, etc: Path) -> None:
    write(etc / "forge.toml", "")  # a fallback exists, but an explicit --config never falls back
    with pytest.raises(ConfigError, match=r"config file .*nope\.toml does not exist") as e:
        load(tmp_path / "nope.toml", settings, etc)
    assert e.value.hint and "--config" in e.value.hint
    with pytest.raises(ConfigError, match="is a directory"):
        load(tmp_path, settings, etc)


def test_toml_syntax_error_has_line_and_column(tmp_path: Path, settings: ForgeSettings, etc: Path) -> None:
    f = write(tmp_path / "forge.toml", '[server]\nport = 8080\nhost = "unterminated\n')
    with pytest.raises(ConfigError) as e:
        load(f, settings, etc)
    assert "invalid TOML" in str(e.value)
    assert "line 3" in str(e.value) and "column" in str(e.value)
    assert str(f) in str(e.value)


def test_non_utf8_file(tmp_path: Path, settings: ForgeSettings, etc: Path) -> None:
    f = tmp_path / "forge.toml"
    f.write_bytes(b'[server]\nhost = "\xff"\n')
    with pytest.raises(ConfigError, match="UTF-8"):
        load(f, settings, etc)


# -- every bad value names its key ----------------------------------------------------------------

BAD = [
    ("[servr]\nport = 1\n", "servr", "unknown key — did you mean 'server'"),
    ("[server]\nprot = 1\n", "server.prot", "unknown key — did you mean 'port'"),
    (
        "[supervisor]\nhealth_intervall = 1.0\n",
        "supervisor.health_intervall",
        "did you mean 'health_interval'",
    ),
    ('[models.gemma]\npath = "g"\nctxsize = 4\n', "models.gemma.ctxsize", "did you mean 'ctx_size'"),
    ("[server]\nport = 70000\n", "server.port", "less than or equal to 65535"),
    ('[server]\nport = "eighty"\n', "server.port", "valid integer"),
    ('[server]\nlog_format = "xml"\n', "server.log_format", "'text' or 'json'"),
    ("[server]\nmax_body_bytes = 0\n", "server.max_body_bytes", "greater than 0"),
    ('[server]\ncors_origins = "*"\n', "server.cors_origins", "valid list"),
    ("[supervisor]\ncrash_loop_max = 0\n", "supervisor.crash_loop_max", "greater than or equal to 1"),
    ("[supervisor]\nhealth_interval = -1\n", "supervisor.health_interval", "greater than 0"),
    (
        "[supervisor]\nrestart_backoff_initial = 10.0\nrestart_backoff_max = 5.0\n",
        "supervisor.restart_backoff_max",
        "below restart_backoff_initial",
    ),
    ('[supervisor]\nvram_reserve = "150%"\n', "supervisor.vram_reserve", "not a percentage below 100%"),
    ("[supervisor]\nvram_reserve = 1.5\n", "supervisor.vram_reserve", "not a fraction below 1"),
    ('[supervisor]\nvram_reserve = "2 parsecs"\n', "supervisor.vram_reserve", "a fraction of each device"),
    ("[supervisor]\nvram_reserve = -1\n", "supervisor.vram_reserve", "is negative"),
    ("[supervisor]\npressure_interval = -2\n", "supervisor.pressure_interval", "greater than or equal to 0"),
    ('[models.gemma]\npath = "g"\npinned = "always"\n', "models.gemma.pinned", "valid boolean"),
    ('[models.gemma]\npath = "g"\nctx_size = -1\n', "models.gemma.ctx_size", "greater than or equal to 0"),
    ("[models.gemma]\nctx_size = 1\n", "models.gemma.path", "Field required"),
    ('[models.gemma]\npath = ""\n', "models.gemma.path", "at least 1 character"),
    ('[models.gemma]\npath = "g"\nparallel = 0\n', "models.gemma.parallel", "greater than or equal to 1"),
    ('[models.gemma]\npath = "g"\ngpu_layers = "most"\n', "models.gemma.gpu_layers", "'auto' or 'all'"),
    ('[models.gemma]\npath = "g"\ngpu_layers = -3\n', "models.gemma.gpu_layers", "number of layers"),
    ('[models.gemma]\npath = "g"\ngpu = "gpu0"\n', "models.gemma.gpu", "'auto', 'cpu', a GPU index"),
    ('[models.gemma]\npath = "g"\ngpu = [0, 0]\n', "models.gemma.gpu", "names a GPU twice"),
    ('[models.gemma]\npath = "g"\ngpu = []\n', "models.gemma.gpu", "a list of indices"),
    ('[models.gemma]\npath = "g"\nttl = -5\n', "models.gemma.ttl", "greater than or equal to 0"),
    ('[models.gemma]\npath = "g"\nmax_concurrency = 0\n', "models.gemma.max_concurrency", "greater than or"),
    ('[models.gemma]\npath = "g"\nqueue = -1\n', "models.gemma.queue", "greater than or equal to 0"),
    ('[models.gemma]\npath = "g"\npreload = "sometimes"\n', "models.gemma.preload", "valid boolean"),
    ('[models.gemma]\npath = "g"\nargs = "--flash-attn on"\n', "models.gemma.args", "valid list"),
    ('[models.gemma]\npath = "g"\nargs = ["--threads", 4]\n', "models.gemma.args.1", "valid string"),
    ('[models."my model"]\npath = "g"\n', "models.my model", "may only use letters, digits"),
    ('[models."a/b"]\npath = "g"\n', "models.a/b", "may only use letters, digits"),
    ('[models]\ngemma = "gemma-3-270m"\n', "models.gemma", "should be a table"),
    ("server = 5\n", "server", "should be a table"),
]


@pytest.mark.parametrize(("text", "key", "reason"), BAD, ids=[b[1] + ":" + b[2][:20] for b in BAD])
def test_bad_value_names_key(
    tmp_path: Path, settings: ForgeSettings, etc: Path, text: str, key: str, reason: str
) -> None:
    f = write(tmp_path / "forge.toml", text)
    with pytest.raises(ConfigError) as e:
        load(f, settings, etc)
    err = e.value
    assert err.key == key
    assert str(err).startswith(f"config forge.toml: {key}: "), str(err)
    assert reason in str(err)
    assert err.hint and str(f) in err.hint  # the fix names the file to edit
    assert err.exit_code == 2


def test_message_format_matches_the_documented_one(
    tmp_path: Path, settings: ForgeSettings, etc: Path
) -> None:
    f = write(tmp_path / "forge.toml", '[models.gemma]\npath = "g"\nctx_size = -1\n')
    with pytest.raises(ConfigError) as e:
        load(f, settings, etc)
    assert str(e.value).startswith(
        "config forge.toml: models.gemma.ctx_size: Input should be greater than or equal to 0"
    )
    assert str(e.value).endswith(f"— fix the value in {f}")


def test_every_error_is_named_not_counted(tmp_path: Path, settings: ForgeSettings, etc: Path) -> None:
    """Three mistakes: the line names all three (a bare "(and 2 more)" before), on one line."""
    f = write(
        tmp_path / "forge.toml",
        '[models.gemma]\npath = "g"\nctx_size = -1\nparalel = 2\n[server]\nport = "eighty"\n',
    )
    with pytest.raises(ConfigError) as e:
        load(f, settings, etc)
    text = str(e.value)
    assert "\n" not in text
    assert "(and 2 more: " in text, text
    for key in ("models.gemma.ctx_size", "models.gemma.paralel", "server.port"):
        assert key in text, text
    assert "did you mean 'parallel'?" in text and "'eighty'" in text


OWNED = [
    "-m",
    "--model",
    "--model=x.gguf",
    "--host",
    "--port",
    "--port=9",
    "--alias",
    "-a",
    "--api-key",
    "--api_key",  # llama.cpp normalises _ to -
    "--api-key-file",
    "--metrics",
    "--no-webui",
    "-hf",
    "--hf-repo",
    "--models-dir",
    "--models-preset",
    "--log-file",
    "--log-colors",
    "--log-verbosity",
    "--log_disable",
]


@pytest.mark.parametrize("flag", OWNED)
def test_args_refuse_flags_forge_owns(tmp_path: Path, settings: ForgeSettings, etc: Path, flag: str) -> None:
    f = write(
        tmp_path / "forge.toml", f'[models.gemma]\npath = "g"\nargs = ["--threads", "4", "{flag}", "x"]\n'
    )
    with pytest.raises(ConfigError) as e:
        load(f, settings, etc)
    assert e.value.key == "models.gemma.args"
    assert repr(flag) in str(e.value) and "set by forge itself" in str(e.value)


def test_keep_context_keys_and_their_defaults(tmp_path: Path, settings: ForgeSettings, etc: Path) -> None:
    f = write(
        tmp_path / "forge.toml", '[models.a]\npath = "g"\nkeep_context = true\n[models.b]\npath = "g"\n'
    )
    cfg = load(f, settings, etc)
    assert cfg.models["a"].keep_context and not cfg.models["b"].keep_context
    assert cfg.context_dir == cfg.state_dir / "contexts" and cfg.server.context_max_bytes == 16 * 2**30
    f = write(tmp_path / "forge.toml", f'[server]\ncontext_dir = "{tmp_path}/c"\ncontext_max_bytes = 1000\n')
    cfg = load(f, settings, etc)
    assert cfg.context_dir == tmp_path / "c" and cfg.server.context_max_bytes == 1000
    f = write(tmp_path / "forge.toml", "[server]\ncontext_max_bytes = -1\n")
    with pytest.raises(ConfigError) as e:
        load(f, settings, etc)
    assert e.value.key == "server.context_max_bytes"


@pytest.mark.parametrize("flag", ["--slot-save-path", "--slot_save_path=/tmp"])
def test_slot_save_path_points_to_keep_context(
    tmp_path: Path, settings: ForgeSettings, etc: Path, flag: str
) -> None:
    f = write(tmp_path / "forge.toml", f'[models.gemma]\npath = "g"\nargs = ["{flag}", "/tmp"]\n')
    with pytest.raises(ConfigError) as e:
        load(f, settings, etc)
    assert e.value.key == "models.gemma.args" and "keep_context = true" in str(e.value)


def test_args_accept_ordinary_flags_and_values(tmp_path: Path, settings: ForgeSettings, etc: Path) -> None:
    args = [
        "--flash-attn",
        "on",
        "--threads",
        "4",
        "-ngl",
        "-1",
        "--temp",
        "-0.5",
        "--jinja",
        "--image-max-tokens",
        "256",
    ]
    toml_list = ", ".join(f'"{a}"' for a in args)
    f = write(tmp_path / "forge.toml", f'[models.gemma]\npath = "g"\nargs = [{toml_list}]\n')
    assert load(f, settings, etc).models["gemma"].args == args


# -- the network must not be opened by accident ---------------------------------------------------


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.10", "example.org", "[2001:db8::1]"])
def test_non_loopback_without_key_is_refused(
    tmp_path: Path, settings: ForgeSettings, etc: Path, host: str
) -> None:
    f = write(tmp_path / "forge.toml", f'[server]\nhost = "{host}"\n')
    with pytest.raises(ConfigError) as e:
        load(f, settings, etc)
    assert e.value.key == "server.host"
    assert host in str(e.value)
    assert e.value.hint and "api_key" in e.value.hint and "allow_unauthenticated = true" in e.value.hint


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.10"])
def test_non_loopback_with_key_or_explicit_opt_out(
    tmp_path: Path, settings: ForgeSettings, etc: Path, host: str
) -> None:
    f = write(tmp_path / "a.toml", f'[server]\nhost = "{host}"\napi_key = "k"\n')
    assert load(f, settings, etc).server.host == host
    f = write(tmp_path / "b.toml", f'[server]\nhost = "{host}"\nallow_unauthenticated = true\n')
    assert load(f, settings, etc).server.allow_unauthenticated
    f = write(tmp_path / "c.toml", f'[server]\nhost = "{host}"\n')
    assert load(f, settings, etc, env={"FORGE_API_KEY": "k"}).server.host == host


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.53", "::1", "[::1]", "localhost", "LOCALHOST"])
def test_loopback_needs_no_key(tmp_path: Path, settings: ForgeSettings, etc: Path, host: str) -> None:
    f = write(tmp_path / "forge.toml", f'[server]\nhost = "{host}"\n')
    assert load(f, settings, etc).server.is_loopback


def test_cli_override_is_validated_too(settings: ForgeSettings, etc: Path) -> None:
    c = load(None, settings, etc)
    assert c.with_server(port=0).server.port == 0
    with pytest.raises(ConfigError) as e:
        c.with_server(host="0.0.0.0")
    assert e.value.key == "server.host"
    with pytest.raises(ConfigError) as e:
        c.with_server(port=-1)
    assert e.value.key == "server.port" and "--port" in str(e.value)
    opened = c.with_server(host="0.0.0.0", api_key="k")
    assert opened.server.host == "0.0.0.0" and opened.state_dir == c.state_dir


# -- environment ----------------------------------------------------------------------------------


def test_env_beats_file(tmp_path: Path, settings: ForgeSettings, etc: Path) -> None:
    f = write(tmp_path / "forge.toml", FULL)
    env = {
        "FORGE_SERVER__PORT": "9000",
        "FORGE_API_KEY": "from-env",
        "FORGE_MODELS__GEMMA__CTX_SIZE": "8192",
        "FORGE_MODELS__GEMMA__ARGS": '["--threads", "2"]',
        "FORGE_SUPERVISOR__HEALTH_FAILURES": "9",
        "FORGE_SERVER__CORS_ORIGINS": '["https://a.example"]',
        "FORGE_CACHE_DIR": "/elsewhere",  # a ForgeSettings variable: not the config's business
        "NOT_FORGE": "x",
    }
    c = load(f, settings, etc, env)
    assert c.server.port == 9000
    assert c.server.api_key is not None and c.server.api_key.get_secret_value() == "from-env"
    assert c.models["gemma"].ctx_size == 8192
    assert c.models["gemma"].args == ["--threads", "2"]
    assert c.models["gemma"].parallel == 4  # untouched keys of the same model stay
    assert c.supervisor.health_failures == 9 and c.supervisor.crash_loop_max == 3
    assert c.server.cors_origins == ["https://a.example"]


def test_env_alone_defines_a_model(settings: ForgeSettings, etc: Path) -> None:
    env = {"FORGE_MODELS__TINY__PATH": "/m/tiny.gguf", "FORGE_MODELS__TINY__GPU": "0,1"}
    c = load(None, settings, etc, env)
    assert c.models["tiny"].path == "/m/tiny.gguf" and c.models["tiny"].gpu == [0, 1]


def test_a_gpu_choice_is_parsed_once_at_load(settings: ForgeSettings, etc: Path) -> None:
    """Placement only matches the parsed value (no re-parse there): spaces, case and a comma list
    are settled here, ordinals become ints and device keys their lower-case key."""
    env = {"FORGE_MODELS__TINY__PATH": "/m/tiny.gguf", "FORGE_MODELS__TINY__GPU": " 2 , AMD:5 "}
    gpu = load(None, settings, etc, env).models["tiny"].gpu
    assert gpu == [2, "amd:5"] and isinstance(gpu, list) and type(gpu[0]) is int
    env["FORGE_MODELS__TINY__GPU"] = " Nvidia:0 "
    assert load(None, settings, etc, env).models["tiny"].gpu == "nvidia:0"


def test_nested_api_key_variable_wins_over_the_short_one(settings: ForgeSettings, etc: Path) -> None:
    c = load(None, settings, etc, {"FORGE_API_KEY": "short", "FORGE_SERVER__API_KEY": "nested"})
    assert c.server.api_key is not None and c.server.api_key.get_secret_value() == "nested"
    assert load(None, settings, etc, {"FORGE_API_KEY": ""}).server.api_key is None


@pytest.mark.parametrize(
    ("env", "key", "var"),
    [
        ({"FORGE_SERVER__PORT": "x"}, "server.port", "FORGE_SERVER__PORT"),
        ({"FORGE_SERVER__PROT": "1"}, "server.prot", "FORGE_SERVER__PROT"),
        (
            {"FORGE_MODELS__G__PATH": "g", "FORGE_MODELS__G__CTX_SIZE": "-1"},
            "models.g.ctx_size",
            "FORGE_MODELS__G__CTX_SIZE",
        ),
        (
            {"FORGE_MODELS__G__PATH": "g", "FORGE_MODELS__G__ARGS": "--x"},
            "models.g.args",
            "FORGE_MODELS__G__ARGS",
        ),
        ({"FORGE_SERVER__HOST": "0.0.0.0"}, "server.host", "FORGE_SERVER__HOST"),
    ],
)
def test_bad_env_value_names_the_variable(
    settings: ForgeSettings, etc: Path, env: dict[str, str], key: str, var: str
) -> None:
    with pytest.raises(ConfigError) as e:
        load(None, settings, etc, env)
    assert e.value.key == key
    assert str(e.value).startswith(f"config {var}: {key}: ")
    if key != "server.host":
        assert e.value.hint and var in e.value.hint


def test_api_key_value_is_never_echoed(tmp_path: Path, settings: ForgeSettings, etc: Path) -> None:
    f = write(tmp_path / "forge.toml", "[server]\napi_key = 987654321\n")
    with pytest.raises(ConfigError) as e:
        load(f, settings, etc)
    assert e.value.key == "server.api_key"
    assert "valid string" in str(e.value)
    assert "987654321" not in str(e.value)


# -- reload fingerprints --------------------------------------------------------------------------


def test_fingerprint_tracks_what_the_child_depends_on(
    tmp_path: Path, settings: ForgeSettings, etc: Path
) -> None:
    base = '[models.m]\npath = "a.gguf"\nctx_size = 4096\nargs = ["--threads", "4"]\nttl = 60\n'

    def fp(text: str) -> str:
        return load(write(tmp_path / "forge.toml", text), settings, etc).model_fingerprint("m")

    ref = fp(base)
    assert fp(base) == ref  # stable
    assert fp(base.replace("a.gguf", "b.gguf")) != ref
    assert fp(base.replace("4096", "8192")) != ref
    assert fp(base.replace('"4"]', '"8"]')) != ref
    assert fp(base + 'gpu = "cpu"\n') != ref
    assert fp(base + "parallel = 2\n") != ref
    assert fp(base.replace("ttl = 60", "ttl = 600")) == ref
    assert fp(base + "max_concurrency = 2\nqueue = 5\npreload = true\n") == ref
    with pytest.raises(KeyError):
        load(write(tmp_path / "forge.toml", base), settings, etc).model_fingerprint("other")


def test_config_is_immutable(settings: ForgeSettings, etc: Path) -> None:
    c = load(None, settings, etc)
    with pytest.raises(ValueError, match="frozen"):
        c.server.port = 1


def test_the_overlapping_knobs_resolve_in_one_place(tmp_path: Path) -> None:
    """FORGE_STATE_DIR is the default that server.state_dir (FORGE_SERVER__STATE_DIR) overrides;
    FORGE_MODEL_DIRS and server.model_dirs (FORGE_SERVER__MODEL_DIRS) add up."""
    settings = ForgeSettings(
        state_dir=tmp_path / "from-settings", model_dirs=[tmp_path / "a"], config_home=tmp_path / "none"
    )
    plain = load_config(None, settings, env={}, system_dir=tmp_path)
    assert plain.state_dir == tmp_path / "from-settings" and plain.model_dirs == [tmp_path / "a"]
    env = {
        "FORGE_SERVER__STATE_DIR": str(tmp_path / "from-env"),
        "FORGE_SERVER__MODEL_DIRS": f'["{tmp_path / "b"}"]',
    }
    both = load_config(None, settings, env=env, system_dir=tmp_path)
    assert both.state_dir == tmp_path / "from-env"
    assert both.model_dirs == [tmp_path / "b", tmp_path / "a"]


def test_workers_and_the_per_model_switch(tmp_path: Path, settings: ForgeSettings, etc: Path) -> None:
    f = write(
        tmp_path / "forge.toml",
        '[[workers]]\naddress = "10.0.0.2:50052"\n[[workers]]\naddress = " gpu-box:050053 "\n'
        '[models.big]\npath = "gemma-3-270m"\nworkers = "all"\n',
    )
    cfg = load(f, settings, etc)
    assert [w.address for w in cfg.workers] == ["10.0.0.2:50052", "gpu-box:50053"]
    assert cfg.models["big"].workers == "all"
    assert load(write(tmp_path / "none.toml", ""), settings, etc).workers == []


@pytest.mark.parametrize(
    ("text", "key", "why"),
    [
        ('[[workers]]\naddress = "10.0.0.2"\n', "workers.0.address", "is not HOST:PORT"),
        ('[[workers]]\naddress = "a:1"\nport = 2\n', "workers.0.port", "unknown key"),
        ('[[workers]]\naddress = "[::1]:50052"\n', "workers.0.address", "IPv4 addresses only"),
        (
            '[[workers]]\naddress = "10.0.0.2:50052"\n[models.m]\npath = "x"\nargs = ["--rpc", "10.0.0.9:1"]\n',
            "models.m.args",
            "--rpc is set by forge when [[workers]] are listed",
        ),
        (
            '[[workers]]\naddress = "10.0.0.2:50052"\n[[workers]]\naddress = "10.0.0.2:050052"\n',
            "workers",
            "10.0.0.2:50052 is listed twice",
        ),
        (
            '[models.m]\npath = "x"\nworkers = "sometimes"\n',
            "models.m.workers",
            "'auto', 'never', 'only' or 'all'",
        ),
    ],
)
def test_bad_worker_config_names_the_key(
    tmp_path: Path, settings: ForgeSettings, etc: Path, text: str, key: str, why: str
) -> None:
    with pytest.raises(ConfigError) as e:
        load(write(tmp_path / "forge.toml", text), settings, etc)
    assert f": {key}: " in str(e.value) and why in str(e.value)


# -- multimodal projectors ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flag", "key"),
    [
        ("--mmproj", "mmproj"),
        ("-mm", "mmproj"),
        ("--mmproj-url", "mmproj"),
        ("--no-mmproj-offload", "mmproj_offload"),
    ],
)
def test_projector_flags_in_args_name_the_key_to_use(
    tmp_path: Path, settings: ForgeSettings, etc: Path, flag: str, key: str
) -> None:
    f = write(tmp_path / "forge.toml", f'[models.v]\npath = "g"\nargs = ["{flag}", "x.gguf"]\n')
    with pytest.raises(ConfigError, match=rf"{flag}.*set by forge itself: use the model's key {key} instead"):
        load(f, settings, etc)


def test_media_path_is_refused_in_args(tmp_path: Path, settings: ForgeSettings, etc: Path) -> None:
    f = write(tmp_path / "forge.toml", '[models.v]\npath = "g"\nargs = ["--media-path", "/srv"]\n')
    with pytest.raises(ConfigError, match=r"file:// media would let any request read the server's files"):
        load(f, settings, etc)


def test_mmproj_accepts_auto_hub_files_and_paths_next_to_the_file(
    tmp_path: Path, settings: ForgeSettings, etc: Path
) -> None:
    f = write(
        tmp_path / "forge.toml",
        '[models.a]\npath = "m.gguf"\nmmproj = "auto"\n'
        '[models.b]\npath = "m.gguf"\nmmproj = "hf:ggml-org/SmolVLM-500M-Instruct-GGUF:mmproj-SmolVLM-500M-Instruct-f16.gguf"\n'
        '[models.c]\npath = "m.gguf"\nmmproj = "./mmproj-m.gguf"\nmmproj_offload = false\n',
    )
    models = load(f, settings, etc).models
    assert models["a"].mmproj == "auto"
    assert models["b"].mmproj is not None and models["b"].mmproj.startswith("hf:ggml-org/")
    assert models["c"].mmproj == str(tmp_path / "mmproj-m.gguf")
    assert models["c"].mmproj_offload is False
    assert models["a"].mmproj_offload is None


def test_mmproj_hub_reference_without_a_file_is_refused(
    tmp_path: Path, settings: ForgeSettings, etc: Path
) -> None:
    f = write(tmp_path / "forge.toml", '[models.v]\npath = "g"\nmmproj = "hf:org/repo:Q4_K_M"\n')
    with pytest.raises(ConfigError, match=r"mmproj 'hf:org/repo:Q4_K_M' is not hf:org/repo:FILE"):
        load(f, settings, etc)
