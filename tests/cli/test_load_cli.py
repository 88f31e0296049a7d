"""`forge load` as a user runs it: real subprocesses, real llama-server, real bad inputs."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import psutil
import pytest

FORGE = [sys.executable, "-m", "rocmforge_supervisor.cli"]


@pytest.fixture
def env(tmp_path: Path, llama_server_bin: Path) -> dict[str, str]:
    return dict(
        os.environ,
        FORGE_STATE_DIR=str(tmp_path / "state"),
        FORGE_LLAMA_SERVER=str(llama_server_bin),
        COLUMNS="200",
    )


def _forge(args: list[str], env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*FORGE, *args], capture_output=True, text=True, env=env, timeout=timeout)


def test_prompt_streams_one_completion(tiny_gguf: Path, env: dict[str, str]) -> None:
    r = _forge(["load", str(tiny_gguf), "--prompt", "Once upon", "--max-tokens", "5", "--gpu", "cpu"], env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip()
    assert "5 completion tokens" in r.stderr and "finish: length" in r.stderr


def _prompt_tokens(stderr: str) -> int:
    found = re.search(r"(\d+) prompt \+ \d+ completion tokens", stderr)
    assert found, stderr
    return int(found.group(1))


def test_embedded_default_model_by_name(env: dict[str, str], gemma_path: Path) -> None:
    """The base model (no chat template in its GGUF) continues the text as given: the prompt is
    its 5 words (and BOS), not a chat turn wrapped in gemma's turn markers."""
    r = _forge(
        ["load", "gemma-3-270m", "-p", "The capital of France is", "-n", "8", "--ctx-size", "512"], env
    )
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.strip()) > 0
    assert _prompt_tokens(r.stderr) <= 7, r.stderr


def test_prompt_to_a_chat_model_is_a_chat_turn(env: dict[str, str], smollm2_path: Path) -> None:
    """`-p` on a model with a chat template goes through the template (as `forge chat`, `ollama
    run` and `llama-cli` do): an answer, where raw text completion stopped at once (an empty
    line, "7 prompt + 1 completion tokens"). `--raw` keeps text completion: no template tokens."""
    args = ["load", "smollm2-135m", "-p", "What is the capital of France?", "-n", "32", "-c", "1024"]
    r = _forge([*args, "--gpu", "cpu"], env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip(), r.stderr  # a 135M model's answer: words, not always the right ones
    answered = re.search(r"\+ (\d+) completion tokens", r.stderr)
    assert answered and int(answered.group(1)) > 1, r.stderr  # not the 1-token stop of before
    raw = _forge([*args, "--gpu", "cpu", "--raw"], env)
    assert raw.returncode == 0, raw.stderr
    assert _prompt_tokens(raw.stderr) < 10 < _prompt_tokens(r.stderr), (raw.stderr, r.stderr)


def _not_gguf(tmp: Path) -> str:
    p = tmp / "notes.gguf"
    p.write_text("hello, not a model\n" * 10)
    return str(p)


def _truncated(tmp: Path, tiny: Path) -> str:
    p = tmp / "cut.gguf"
    p.write_bytes(tiny.read_bytes()[: tiny.stat().st_size // 3])
    return str(p)


@pytest.mark.parametrize(
    ("case", "needle"),
    [
        ("missing", "no model file at"),
        ("empty", "the model reference is empty"),
        ("directory", "is a directory"),
        ("not_gguf", "GGUF"),
        ("truncated", "truncated"),
        ("bad_ctx", "--ctx-size"),
        ("bad_gpu", "--gpu"),
        ("bad_ngl", "--n-gpu-layers"),
    ],
)
def test_bad_input_one_line_exit_2_nothing_left(
    case: str, needle: str, tmp_path: Path, tiny_gguf: Path, env: dict[str, str]
) -> None:
    args = {
        "missing": ["load", str(tmp_path / "nope.gguf")],
        "empty": ["load", ""],  # not the current directory
        "directory": ["load", str(tmp_path)],
        "not_gguf": ["load", _not_gguf(tmp_path)],
        "truncated": ["load", _truncated(tmp_path, tiny_gguf)],
        "bad_ctx": ["load", str(tiny_gguf), "--ctx-size", "-3"],
        "bad_gpu": ["load", str(tiny_gguf), "--gpu", "fastest"],
        "bad_ngl": ["load", str(tiny_gguf), "--n-gpu-layers", "lots"],
    }[case]
    r = _forge([*args, "--prompt", "x"], env, timeout=60)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert needle in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    # no_orphans (autouse) checks that no llama-server was left behind.


def test_port_taken_is_a_usage_error(tiny_gguf: Path, env: dict[str, str]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = _forge(["load", str(tiny_gguf), "--port", str(port), "--prompt", "x", "--gpu", "cpu"], env)
    assert r.returncode == 2
    assert f"port {port}" in r.stderr and "already in use" in r.stderr


def test_foreground_serves_until_ctrl_c(tiny_gguf: Path, env: dict[str, str]) -> None:
    proc = subprocess.Popen(
        [*FORGE, "load", str(tiny_gguf), "--gpu", "cpu", "--ctx-size", "512"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        base = proc.stdout.readline().strip()
        assert base.startswith("http://127.0.0.1:") and base.endswith("/v1")
        assert httpx.get(base.removesuffix("/v1") + "/health", timeout=5).status_code == 200
        children = [
            p for p in psutil.Process(proc.pid).children(recursive=True) if "llama-server" in p.name()
        ]
        assert len(children) == 1
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
        _, alive = psutil.wait_procs(children, timeout=5)
        assert not alive
        assert proc.stderr is not None
        err = proc.stderr.read()
        assert "API key" in err and "pid / port" in err and "stopping" in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()


def test_foreground_curl_asks_a_chat_model_through_chat(smollm2_path: Path, env: dict[str, str]) -> None:
    """The `try` curl of foreground `forge load` on a chat model uses the chat route at
    temperature 0, and pasted as printed it answers the question right."""
    proc = subprocess.Popen(
        [*FORGE, "load", "smollm2-135m", "--gpu", "cpu", "--ctx-size", "1024"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(env, COLUMNS="1000"),  # the panel's row on one line
    )
    try:
        assert proc.stderr is not None
        line = next(row for row in iter(proc.stderr.readline, "") if "curl -s" in row)
        curl = line[line.index("curl -s") :].rstrip().rstrip("│").rstrip()
        assert "/v1/chat/completions" in curl and '"temperature": 0' in curl, curl
        r = subprocess.run(["bash", "-c", curl], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        assert "Paris" in json.loads(r.stdout)["choices"][0]["message"]["content"], r.stdout
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("key", ["client-config-key", None])
def test_foreground_port_and_key_are_the_users(tiny_gguf: Path, env: dict[str, str], key: str | None) -> None:
    """`--port` and `--api-key` (or `--no-api-key`) so that a client is configured once, not
    after every start (a new random port and key each run before)."""
    port = _free_port()
    auth = ["--api-key", key] if key else ["--no-api-key"]
    proc = subprocess.Popen(
        [*FORGE, "load", str(tiny_gguf), "--gpu", "cpu", "-c", "256", "--port", str(port), *auth],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        base = proc.stdout.readline().strip()
        assert base == f"http://127.0.0.1:{port}/v1", base
        body = {"prompt": "Hi", "max_tokens": 2}
        r = httpx.post(f"{base}/completions", json=body, timeout=30)
        if key:
            assert r.status_code == 401
            r = httpx.post(
                f"{base}/completions", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=30
            )
        assert r.status_code == 200, r.text
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
        assert proc.stderr is not None
        err = proc.stderr.read()
        assert (key in err) if key else ("none (loopback only)" in err)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()


def test_api_key_options_are_checked(tiny_gguf: Path, env: dict[str, str]) -> None:
    r = _forge(["load", str(tiny_gguf), "--api-key", "k", "--no-api-key", "-p", "x"], env)
    assert r.returncode == 2 and "--api-key" in r.stderr
    r = _forge(["load", str(tiny_gguf), "--api-key", "café key", "-p", "x"], env)
    assert r.returncode == 2 and "ASCII" in r.stderr


def test_shell_completion_installs_and_completes(tmp_path: Path, env: dict[str, str]) -> None:
    """`forge --install-completion` (typer's) writes a bash completion that really completes."""
    forge_bin = Path(sys.executable).parent / "forge"
    if not forge_bin.is_file():
        pytest.skip("needs the installed forge script")
    home = tmp_path / "home"
    home.mkdir()
    e = dict(
        env, HOME=str(home), SHELL="/bin/bash", PATH=f"{forge_bin.parent}{os.pathsep}{env.get('PATH', '')}"
    )
    r = subprocess.run(
        [str(forge_bin), "--install-completion"], capture_output=True, text=True, env=e, timeout=60
    )
    assert r.returncode == 0, r.stderr
    script = home / ".bash_completions" / "forge.sh"
    assert script.is_file() and str(script) in (home / ".bashrc").read_text()
    probe = f'source "{script}"; COMP_WORDS=(forge lo); COMP_CWORD=1; _forge_completion forge lo forge; printf "%s\\n" "${{COMPREPLY[@]}}"'
    r = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, env=e, timeout=60)
    assert sorted(r.stdout.split()) == ["load", "logs"], (r.stdout, r.stderr)


def test_pull_offline_is_one_line_at_once(env: dict[str, str]) -> None:
    """No network: one line and an exit code, not ~24 s of huggingface-hub retries. `.invalid`
    never resolves (RFC 2606), which is what a machine without network or DNS sees."""
    e = {k: v for k, v in env.items() if k.lower() not in ("https_proxy", "all_proxy")}
    e.update(HF_ENDPOINT="https://hub.invalid", HF_HUB_OFFLINE="0")
    r = _forge(["pull", "org/repo:Q4_K_M"], e, timeout=60)
    assert r.returncode == 1
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("error: cannot reach hub.invalid: the name does not resolve"), line
    assert "HF_HUB_OFFLINE=1" in line


def test_chat_default_model_answers(env: dict[str, str], smollm2_path: Path) -> None:
    """`forge chat` with no model: the instruction-tuned default, in a child of its own (no
    service runs in this state dir), answers a question in English."""
    r = subprocess.run(
        [*FORGE, "chat", "--temperature", "0", "-c", "1024", "--gpu", "cpu"],
        input="What is the capital of France? Answer in one word.\n/exit\n",
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert "smollm2-135m ready" in r.stderr
    assert "Paris" in r.stdout, r.stdout
