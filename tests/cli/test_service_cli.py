"""The CLI against a real running `forge serve` (one per module): the pasteable examples it prints,
`forge chat` / `forge load -p` using it instead of a second llama-server, and the commands that
talk to it (ps, logs, unload, reload). Real subprocesses, real llama-server, the real openai SDK."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.service import FORGE, Service, running_service, wait_for, write_config

LONG = "a-model-with-a-rather-long-descriptive-name-for-the-terminal-q4"  # 63 characters


@pytest.fixture(scope="module")
def svc(
    tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path, tiny_gguf: Path, llama_server_bin: Path
) -> Iterator[Service]:
    tmp = tmp_path_factory.mktemp("svc")
    cfg = write_config(
        tmp / "forge.toml",
        f'[models.smollm2-135m]\npath = "smollm2-135m"\nctx_size = 2048\nparallel = 2\ngpu = "cpu"\npreload = true\n'
        f'[models.{LONG}]\npath = "{tiny_gguf}"\nctx_size = 512\ngpu = "cpu"\n',
    )
    with running_service(cfg, tmp / "state", llama_server_bin) as s:
        wait_for(lambda: s.model("smollm2-135m")["state"] == "ready", timeout=120, what="smollm2 ready")
        yield s


def forge(
    svc: Service, *args: str, stdin: str | None = None, columns: int = 200, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, FORGE_STATE_DIR=str(svc.state_dir), COLUMNS=str(columns), NO_COLOR="1")
    env.pop("FORGE_API_KEY", None)
    return subprocess.run(
        [*FORGE, *args], input=stdin, capture_output=True, text=True, env=env, timeout=timeout
    )


def _printed_examples(stderr: str) -> tuple[str, str]:
    """The curl line and the python heredoc `forge serve` printed after `try it`."""
    lines = stderr.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("try it"))
    curl = next(line for line in lines[start:] if line.startswith("curl "))
    py_start = next(i for i in range(start, len(lines)) if lines[i].endswith(" - <<'EOF'"))
    py_end = next(i for i in range(py_start + 1, len(lines)) if lines[i] == "EOF")
    return curl, "\n".join(lines[py_start : py_end + 1])


def _bash(script: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    full = dict(os.environ, PATH=path, **(env or {}))
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=120, env=full)


def _bare_shell(script: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """A shell as a new user's: no virtualenv on the PATH, no VIRTUAL_ENV, no PYTHONPATH."""
    full = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    full.update(PATH="/usr/bin:/bin", **(env or {}))
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=120, env=full)


def test_printed_examples_paste_and_run(svc: Service) -> None:
    """What `forge serve` prints pastes into a shell as it is: no `…`, a key that works, a
    max_tokens. (Before: a SyntaxError in Python, then a UnicodeEncodeError inside httpx, then
    `No module named 'openai'` where only `make setup` ran.) Both are deterministic
    (temperature 0) and answer the question right: the first answer a new user sees."""
    err = svc.stderr_text()
    curl, program = _printed_examples(err)
    assert "…" not in curl + program and '"max_tokens": 64' in curl and "max_tokens=64" in program
    assert '"temperature": 0' in curl and "temperature=0" in program
    # Issue 37: the README says "a Python (OpenAI SDK) example": it was a TextModel program that
    # ran only in the repo's .venv. The SDK's own code now, run by an interpreter that has it.
    assert "from openai import OpenAI" in program and "rocmforge_supervisor" not in program
    assert program.startswith(sys.executable + " - <<'EOF'"), program
    r = _bash(curl)
    assert r.returncode == 0, r.stderr
    body = json.loads(r.stdout)
    assert "Paris" in body["choices"][0]["message"]["content"], body
    assert body["usage"]["completion_tokens"] <= 64
    r = _bare_shell(program)
    assert r.returncode == 0, r.stderr
    assert "Paris" in r.stdout, r.stdout
    assert "color_message" not in err  # uvicorn's extra stays out of the log lines


def test_printed_examples_with_an_api_key(tmp_path: Path, smollm2_path: Path, llama_server_bin: Path) -> None:
    cfg = write_config(
        tmp_path / "forge.toml",
        '[server]\napi_key = "s3cret-key"\n[models.smollm2-135m]\npath = "smollm2-135m"\n'
        'ctx_size = 1024\nparallel = 1\ngpu = "cpu"\npreload = true\n',
    )
    with running_service(cfg, tmp_path / "state", llama_server_bin, api_key="s3cret-key") as keyed:
        wait_for(lambda: keyed.model("smollm2-135m")["state"] == "ready", timeout=120, what="ready")
        err = keyed.stderr_text()
        assert "s3cret-key" not in err  # the key itself is never printed
        curl, program = _printed_examples(err)
        assert "$FORGE_API_KEY" in curl and 'os.environ["FORGE_API_KEY"]' in program
        assert _bash(curl + " -o /dev/null -w '%{http_code}'", {"FORGE_API_KEY": "wrong"}).stdout == "401"
        r = _bash(curl, {"FORGE_API_KEY": "s3cret-key"})
        assert json.loads(r.stdout)["choices"][0]["message"]["content"].strip(), r.stdout
        r = _bare_shell(program, {"FORGE_API_KEY": "wrong"})
        assert r.returncode != 0 and "401" in r.stderr + r.stdout, (r.stdout, r.stderr)
        r = _bare_shell(program, {"FORGE_API_KEY": "s3cret-key"})
        assert r.returncode == 0 and "Paris" in r.stdout, (r.stdout, r.stderr)


def test_chat_uses_the_running_service(svc: Service) -> None:
    """`forge chat NAME` with a service serving NAME: no second llama-server (like `ollama run`)."""
    before = {p.pid for p in svc.llama_children()}
    r = forge(
        svc, "chat", "--temperature", "0", stdin="What is the capital of France? Answer in one word.\n/exit\n"
    )
    assert r.returncode == 0, r.stderr
    assert "Paris" in r.stdout, r.stdout
    assert f"forge service at {svc.url}" in r.stderr
    # Issue 37: it said "(--private: a llama-server of its own)", as if --private were on.
    assert "(add --private for a llama-server of this command's own)" in r.stderr, r.stderr
    assert "(--private:" not in r.stderr
    # the chat ran in the service's child: no llama-server child of the CLI, none added to the service
    assert {p.pid for p in svc.llama_children()} == before


def test_chat_slash_commands_stay_local(svc: Service) -> None:
    """`/help` and unknown `/commands` are answered by `forge chat` itself, never sent to the model
    as a question (`/help` was); `//text` is the way to send text that starts with "/"."""
    r = forge(svc, "chat", "--temperature", "0", "-n", "4", stdin="/help\n/nope now\n/reset\n/bye\n")
    assert r.returncode == 0, r.stderr
    assert "/reset    forget the conversation" in r.stdout and "//text" in r.stdout, r.stdout
    assert "unknown command /nope (not sent to the model)" in r.stdout, r.stdout
    assert "conversation cleared" in r.stdout and "model>" not in r.stdout, r.stdout
    r = forge(svc, "chat", "--temperature", "0", "-n", "4", stdin="//help\n/exit\n")
    assert r.returncode == 0 and r.stdout.count("model>") == 1, r.stdout


def test_load_prompt_uses_the_running_service(svc: Service) -> None:
    r = forge(svc, "load", LONG, "-p", "Hello", "-n", "4")  # not loaded yet: the service loads it
    assert r.returncode == 0, r.stderr
    assert "4 completion tokens" in r.stderr and f"forge service at {svc.url}" in r.stderr
    assert svc.model(LONG)["state"] == "ready"
    # The service's child, not ours: unload it, so that the test leaves what it found.
    assert forge(svc, "unload", LONG).returncode == 0
    wait_for(lambda: not any(LONG in " ".join(p.cmdline()) for p in svc.llama_children()), what="unloaded")


def test_load_prompt_on_the_service_is_a_chat_turn(svc: Service) -> None:
    """`forge load NAME -p` through the service: a chat model gets the question as a chat turn
    (the service's /api/show says it has a template), and answers it."""
    question = "What is the capital of France? Answer in one word."
    r = forge(svc, "load", "smollm2-135m", "-p", question, "-n", "16")
    assert r.returncode == 0, r.stderr
    assert f"forge service at {svc.url}" in r.stderr and "Paris" in r.stdout, (r.stdout, r.stderr)
    raw = forge(svc, "load", "smollm2-135m", "-p", question, "-n", "16", "--raw")
    assert raw.returncode == 0, raw.stderr
    prompt_tokens = [int(x.stderr.split(" prompt")[0].split()[-1]) for x in (raw, r)]
    assert prompt_tokens[0] < prompt_tokens[1], (raw.stderr, r.stderr)  # the template's tokens


def test_private_flag_starts_a_child_of_its_own(svc: Service, tiny_gguf: Path) -> None:
    r = forge(svc, "load", "smollm2-135m", "--private", "-p", "Hello", "-n", "3", "-c", "512", "--gpu", "cpu")
    assert r.returncode == 0, r.stderr
    assert "forge service" not in r.stderr and "3 completion tokens" in r.stderr
    # Its child logged to a file of its own: `forge logs` shows the service's child alone.
    private_start = "--ctx-size 512"
    own = (svc.state_dir / "logs" / "load-smollm2-135m.log").read_text()
    assert private_start in own
    shown = forge(svc, "logs", "smollm2-135m", "--all", "-n", "100000")
    assert shown.returncode == 0, shown.stderr
    assert "[forge] starting:" in shown.stdout and "--ctx-size 2048" in shown.stdout
    assert private_start not in shown.stdout


def test_logs_collapse_the_idle_lines(svc: Service) -> None:
    """A quiet model's log was mostly `update_slots: all slots are idle` (one per task its loop
    wakes for): `forge logs` shows a run of them as one note, `--all` as written."""
    idle = "update_slots: all slots are idle"
    log = svc.state_dir / "logs" / "smollm2-135m.log"
    with svc.client() as c:
        for _ in range(6):  # each /slots is a task: the loop wakes, finds every slot idle, says so
            assert c.get("/slots", params={"model": "smollm2-135m"}).status_code == 200
    wait_for(lambda: log.read_text().count(idle) >= 6, timeout=30, what="idle lines in the log")
    raw = forge(svc, "logs", "smollm2-135m", "--all", "-n", "100000").stdout.splitlines()
    assert sum(idle in line for line in raw) >= 6
    shown = forge(svc, "logs", "smollm2-135m", "-n", "100000").stdout.splitlines()
    assert not any(idle in line and "hidden" not in line for line in shown), shown[-10:]
    notes = [line for line in shown if "idle line" in line and "hidden" in line]
    assert notes and all(line.startswith("[forge] (") for line in notes)
    assert len(shown) < len(raw)
    # a short tail is the last lines that say something, not a screen of idle lines
    tail = forge(svc, "logs", "smollm2-135m", "-n", "5").stdout.splitlines()
    assert len(tail) == 5 and sum("idle line" in line for line in tail) <= 3


def test_url_chooses_the_service(svc: Service) -> None:
    r = forge(svc, "load", "smollm2-135m", "--url", svc.url + "/v1", "-p", "Hi", "-n", "2")
    assert r.returncode == 0, r.stderr
    r = forge(svc, "chat", "nope", "--url", svc.url, stdin="/exit\n")
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith(f"error: the forge service at {svc.url} does not serve 'nope'"), r.stderr
    assert "smollm2-135m" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = forge(svc, "chat", "--url", "http://127.0.0.1:9", stdin="/exit\n")
    assert r.returncode == 1 and r.stderr.startswith("error: no forge service answers at http://127.0.0.1:9")


def test_ps_keeps_names_whole_on_80_columns(svc: Service) -> None:
    """Columns go before a name is cut (`gemma…` at 80 columns before)."""
    r = forge(svc, "ps", columns=80)
    assert r.returncode == 0, r.stderr
    assert LONG in r.stdout and "smollm2-135m" in r.stdout
    assert max(len(line) for line in r.stdout.splitlines()) <= 80
    assert "state" in r.stdout and "columns left out" in r.stderr
    wide = forge(svc, "ps", columns=250)
    assert "last error" in wide.stdout and "columns left out" not in wide.stderr


@pytest.mark.parametrize("command", ["logs", "unload"])
def test_unknown_model_is_one_line_exit_2(svc: Service, command: str) -> None:
    """`forge logs nope` printed the raw JSON body and exited 1; `unload nope` one line, exit 2."""
    r = forge(svc, command, "nope")
    assert r.returncode == 2, (r.stdout, r.stderr)
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("error: ") and "nope" in line and "{" not in line


def test_reload_prints_a_summary(svc: Service) -> None:
    r = forge(svc, "reload")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "config reloaded: 0 changed, 0 added, 0 removed, 2 unchanged"
    r = forge(svc, "reload", "--json")
    assert set(json.loads(r.stdout)["unchanged"]) == {"smollm2-135m", LONG}


def test_the_service_answers_with_the_default_model(svc: Service) -> None:
    with httpx.Client(base_url=svc.url, timeout=60) as c:
        r = c.post(
            "/v1/chat/completions",
            json={
                "model": "smollm2-135m",
                "temperature": 0,
                "max_tokens": 16,
                "messages": [
                    {"role": "user", "content": "What is the capital of France? Answer in one word."}
                ],
            },
        )
    assert r.status_code == 200, r.text
    assert "Paris" in r.json()["choices"][0]["message"]["content"]


def test_tools_to_the_default_model_are_refused_with_a_model_that_takes_them(svc: Service) -> None:
    """SmolLM2's template has no tools: a request with them (every Claude Code request) is a 400
    in Anthropic's shape naming the model and a small model that handles tools — not an answer
    that ignores them."""
    tool = {"name": "get_weather", "description": "The weather", "input_schema": {"type": "object"}}
    with httpx.Client(base_url=svc.url, timeout=60) as c:
        r = c.post(
            "/v1/messages",
            json={
                "model": "smollm2-135m",
                "max_tokens": 16,
                "tools": [tool],
                "messages": [{"role": "user", "content": "Weather in Paris?"}],
            },
        )
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert "'smollm2-135m' cannot call tools" in error["message"] and "Qwen" in error["message"]
