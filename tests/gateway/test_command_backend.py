"""``backend = "command"``: any OpenAI-compatible server, run as the command a user names, behind
`forge serve` with the same lifecycle as every child.

The third-party server here is llama.cpp's own llama-server, started through a symlink named
``openai-server`` by a command line the test writes (forge knows nothing of it but that command,
its health path and its routes): the issue allows it, and no small OpenAI-compatible server ships
on PyPI without a model of its own. It is spoken to by the real openai, anthropic and ollama
clients, SIGKILLed (forge restarts it), and a command that never gets ready fails its start with a
message naming ``health``.
"""

from __future__ import annotations

import os
import re
import signal
import sys
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import anthropic
import httpx
import ollama
import openai
import psutil
import pytest

from rocmforge_supervisor._errors import ConfigError
from rocmforge_supervisor.config import ForgeSettings, load_config
from tests.support.service import FAST, Service, running_service, wait_for, write_config

ROUTES = ["/v1/chat/completions", "/v1/completions", "/v1/messages"]


def _cmd(server: Path, flags: tuple[str, ...]) -> str:
    argv = [str(server), "--host", "${HOST}", "--port", "${PORT}", "-m", "${MODEL}", "--alias", "${NAME}"]
    argv += ["-c", "1024", "-np", "2", "--no-webui", *flags]
    return "[" + ", ".join(f'"{a}"' for a in argv) + "]"


@pytest.fixture(scope="module")
def svc(
    tmp_path_factory: pytest.TempPathFactory,
    llama_server_bin: Path,
    llama_server_flags: tuple[str, ...],
    smollm2_path: Path,
) -> Iterator[Service]:
    d = tmp_path_factory.mktemp("command")
    server = d / "bin" / "openai-server"
    server.parent.mkdir()
    server.symlink_to(llama_server_bin)
    config = write_config(
        d / "forge.toml",
        FAST
        + f"""
[models.ext]
backend = "command"
path = "{smollm2_path}"
cmd = {_cmd(server, llama_server_flags)}
health = "/health"
routes = {ROUTES!r}
memory = "400MiB"
gpu = "cpu"
preload = true
max_concurrency = 2
""".replace("'", '"'),
    )
    with running_service(config, d / "state", llama_server_bin) as s:
        yield s


def _child(svc: Service) -> psutil.Process:
    pid = svc.model("ext")["pid"]
    assert isinstance(pid, int)
    return psutil.Process(pid)


def test_the_command_runs_as_configured(svc: Service) -> None:
    row = svc.model("ext")
    assert row["backend"] == "command" and row["state"] == "ready"
    cmdline = _child(svc).cmdline()
    assert Path(cmdline[0]).name == "openai-server"
    assert cmdline[cmdline.index("--alias") + 1] == "ext"  # ${NAME}
    assert "${" not in " ".join(cmdline)
    assert "--api-key-file" not in cmdline  # an unknown program gets no key: loopback only
    port = cmdline[cmdline.index("--port") + 1]
    assert row["port"] == int(port)


def test_three_dialects_stream_through_the_command(svc: Service, closing: ExitStack) -> None:
    oa = closing.enter_context(openai.OpenAI(base_url=f"{svc.url}/v1", api_key="none", max_retries=0))
    stream = oa.chat.completions.create(
        model="ext", messages=[{"role": "user", "content": "Say hi"}], max_tokens=8, stream=True
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text

    an = closing.enter_context(anthropic.Anthropic(base_url=svc.url, api_key="none", max_retries=0))
    with an.messages.stream(model="ext", max_tokens=6, messages=[{"role": "user", "content": "Hi"}]) as s:
        assert "".join(s.text_stream)
        assert s.get_final_message().stop_reason == "max_tokens"

    ol = closing.enter_context(ollama.Client(host=svc.url))
    parts = list(
        ol.chat(
            model="ext", messages=[{"role": "user", "content": "Hi"}], stream=True, options={"num_predict": 6}
        )
    )
    assert parts[-1].done and "".join(p.message.content or "" for p in parts)

    with httpx.Client(base_url=svc.url, timeout=30) as c:
        metrics = c.get("/metrics").text
    for route in ("/v1/chat/completions", "/v1/messages"):
        row = rf'forge_requests_total{{endpoint="{route}",model="ext",status="200"}} (\S+)'
        m = re.search(row, metrics)
        assert m and float(m.group(1)) >= 1, f"{route} not counted for the command model:\n" + "\n".join(
            line for line in metrics.splitlines() if 'model="ext"' in line
        )


def test_a_route_the_command_does_not_serve_is_refused_before_it_queues(svc: Service) -> None:
    with httpx.Client(base_url=svc.url, timeout=30) as c:
        r = c.post("/v1/embeddings", json={"model": "ext", "input": "hello"})
    assert r.status_code == 400
    message = r.json()["error"]["message"]
    assert "ext" in message and "/v1/chat/completions" in message and "answers only" in message


def test_a_sigkilled_command_is_restarted(svc: Service) -> None:
    old = _child(svc)
    restarts = svc.model("ext")["restarts"]
    os.kill(old.pid, signal.SIGKILL)
    wait_for(
        lambda: (row := svc.model("ext"))["state"] == "ready" and row["pid"] not in (None, old.pid),
        timeout=60,
        what="the command restarted",
    )
    assert svc.model("ext")["restarts"] == restarts + 1
    with httpx.Client(base_url=svc.url, timeout=60) as c:
        r = c.post(
            "/v1/chat/completions",
            json={"model": "ext", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4},
        )
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] is not None


def test_a_command_that_never_gets_ready_fails_naming_health(tmp_path: Path, llama_server_bin: Path) -> None:
    """A FAKE server: a Python one-liner that prints a line, never listens and never exits."""
    never = [
        sys.executable,
        "-c",
        "import sys, time; print('up on', sys.argv[1], flush=True); time.sleep(600)",
    ]
    marker = str(tmp_path)  # this test's own child, not another test's running beside it
    cmd = "[" + ", ".join(f'"{a}"' for a in [*never, "${PORT}", marker]) + "]"
    config = write_config(
        tmp_path / "forge.toml",
        FAST
        + "load_stall_timeout = 2\ncrash_loop_max = 1\n"
        + f"""
[models.stuck]
backend = "command"
path = "none"
cmd = {cmd}
health = "/v1/models"
gpu = "cpu"
""",
    )
    with running_service(config, tmp_path / "state", llama_server_bin) as svc, svc.client() as c:
        r = c.post("/api/models/stuck/load", timeout=60)
        assert r.status_code >= 400
        row = svc.model("stuck")
        assert row["state"] == "failed"
        error = row["last_error"] or ""
        assert "GET /v1/models" in error and "health" in error
        assert row["pid"] is None
    assert not [p for p in psutil.process_iter(["cmdline"]) if marker in (p.info["cmdline"] or [])]


@pytest.mark.parametrize(
    ("keys", "expected"),
    [
        ('cmd = ["/bin/server", "-m", "x"]', "cmd must pass ${PORT}"),
        ('cmd = ["/bin/server", "--port", "${PORT}", "${GPU}"]', "${GPU}, which forge does not fill in"),
        (
            'cmd = ["/bin/server", "--port", "${PORT}"]\nctx_size = 512',
            'ctx_size does not apply to a backend = "command"',
        ),
        ('cmd = ["/bin/server", "--port", "${PORT}"]\nhealth = "/h"\nready_log = "up"', "not both"),
        ('cmd = ["/bin/server", "--port", "${PORT}"]\nroutes = ["/embeddings"]', "is not an OpenAI route"),
        ('cmd = ["/bin/server", "--port", "${PORT}"]\nmemory = "lots"', "is not bytes"),
        ("", 'a backend = "command" model needs cmd'),
    ],
)
def test_a_bad_command_is_refused_at_config_check(
    tmp_path: Path, forge_settings: ForgeSettings, keys: str, expected: str
) -> None:
    bad = write_config(tmp_path / "forge.toml", f'[models.x]\nbackend = "command"\npath = "m"\n{keys}\n')
    with pytest.raises(ConfigError) as err:
        load_config(bad, forge_settings, env={})
    assert expected in str(err.value)


def test_a_command_key_on_a_llama_model_is_refused(tmp_path: Path, forge_settings: ForgeSettings) -> None:
    bad = write_config(tmp_path / "forge.toml", '[models.x]\npath = "m.gguf"\ncmd = ["/bin/server"]\n')
    with pytest.raises(ConfigError) as err:
        load_config(bad, forge_settings, env={})
    assert 'cmd applies only to a backend = "command" model' in str(err.value)
