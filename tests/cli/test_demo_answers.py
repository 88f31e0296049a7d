"""The embedded chat model answers the README's questions right, with the product's own defaults.

SmolLM2-135M-Instruct under its GGUF's default system prompt answered "What's the capital of
France?" at temperature 0 with "L'Étoile, la Marseillaise, la Cité, la France, la France…" until
the token limit, and under llama-server's default temperature (0.8, what a curl without
``temperature`` gets) the README's "What is the capital of France?" in French about one time in
three. Its catalog entry now runs it greedy with a system prompt of its own. These ask the real
model in the real llama-server: one child for every question, as ``forge load -p`` asks
(temperature 0) and as the README's curl does (no temperature, no system prompt), and once the
README's own command line.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from rocmforge_supervisor import Message, load_model
from rocmforge_supervisor.config import ForgeSettings
from rocmforge_supervisor.models import DEFAULT_MODEL
from rocmforge_supervisor.models._catalog import SMOLLM2_SYSTEM, default_args

#: A question and the words one of which a right answer has (lower case).
QUESTIONS = [
    ("What is the capital of France?", ("paris",)),
    ("What's the capital of France?", ("paris",)),
    ("What is the capital of Italy?", ("rome",)),
    ("What is 2+2?", ("4", "four")),
    ("What colour is the sky?", ("blue",)),
    ("Write one sentence about the sea.", ("sea", "ocean")),
    ("Hi", ("hello", "hi")),
]


def _right(answer: str, words: tuple[str, ...]) -> bool:
    return any(w in answer.lower() for w in words)


@pytest.mark.timeout(400)
def test_the_demo_model_answers_the_readme_questions(
    state_settings: ForgeSettings, smollm2_path: Path
) -> None:
    wrong: list[str] = []
    tm = load_model(DEFAULT_MODEL, settings=state_settings, ctx_size=1024, parallel=1, gpu="cpu")
    with tm:
        headers = {"Authorization": f"Bearer {tm.server.api_key}"} if tm.server.api_key else {}
        with httpx.Client(base_url=tm.openai_base_url, headers=headers, timeout=120) as http:
            for question, words in QUESTIONS:
                # as `forge load -p` and `forge chat` send it: temperature 0, no system prompt
                said = "".join(
                    t.text for t in tm.chat([Message("user", question)], max_tokens=32, temperature=0.0)
                )
                if not _right(said, words):
                    wrong.append(f"forge load -p {question!r}: {said!r}")
                # as the README's curl and OpenAI SDK examples send it: no temperature at all
                r = http.post(
                    "/chat/completions",
                    json={"max_tokens": 32, "messages": [{"role": "user", "content": question}]},
                )
                r.raise_for_status()
                said = r.json()["choices"][0]["message"]["content"]
                if not _right(said, words):
                    wrong.append(f"curl {question!r}: {said!r}")
    assert not wrong, "\n".join(wrong)


def test_a_requests_own_system_prompt_replaces_the_default(
    state_settings: ForgeSettings, smollm2_path: Path
) -> None:
    tm = load_model(DEFAULT_MODEL, settings=state_settings, ctx_size=512, parallel=1, gpu="cpu")
    with tm:
        headers = {"Authorization": f"Bearer {tm.server.api_key}"} if tm.server.api_key else {}
        with httpx.Client(base_url=tm.base_url, headers=headers, timeout=60) as http:

            def prompt(messages: list[dict[str, str]]) -> str:
                r = http.post("/apply-template", json={"messages": messages})
                r.raise_for_status()
                return str(r.json()["prompt"])

            hi = {"role": "user", "content": "Hi"}
            assert prompt([hi]) == (
                f"<|im_start|>system\n{SMOLLM2_SYSTEM}<|im_end|>\n"
                "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
            )
            own = prompt([{"role": "system", "content": "Be brief."}, hi])
            assert own.startswith("<|im_start|>system\nBe brief.<|im_end|>\n") and SMOLLM2_SYSTEM not in own


def test_the_defaults_go_to_the_short_name_only_and_yield_to_the_users_args() -> None:
    ours = default_args(DEFAULT_MODEL)
    assert ours[:2] == ["--temp", "0"] and ours[2] == "--chat-template" and SMOLLM2_SYSTEM in ours[3]
    assert "\n" not in ours[3]  # the child's command line (and its log line) stays one line
    for user in (["--chat-template", "chatml"], ["--chat-template-file=t.jinja"], ["--no-jinja"]):
        assert default_args(DEFAULT_MODEL, user) == ["--temp", "0"], user
    assert default_args(DEFAULT_MODEL, ["--jinja", "--temp", "0.7"]) == ours  # theirs come later: they win
    assert default_args("gemma-3-270m") == []
    assert default_args("/models/SmolLM2-135M-Instruct.Q4_1.gguf") == []
    assert default_args("hf:HuggingFaceTB/SmolLM2-135M-Instruct-GGUF:Q4_K_M") == []


@pytest.mark.timeout(300)
def test_the_readme_command_answers_paris(tmp_path: Path, llama_server_bin: Path, smollm2_path: Path) -> None:
    env = dict(os.environ, FORGE_STATE_DIR=str(tmp_path / "state"), FORGE_LLAMA_SERVER=str(llama_server_bin))
    readme = ["load", "smollm2-135m", "-p", "What is the capital of France?"]
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "rocmforge_supervisor.cli",
            *readme,
            "--private",
            "-c",
            "1024",
            "--gpu",
            "cpu",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
    )
    assert r.returncode == 0, r.stderr
    assert "Paris" in r.stdout and "finish: stop" in r.stderr, (r.stdout, r.stderr)
