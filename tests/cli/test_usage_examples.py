"""The Python example `forge serve` prints (issue 37 item 13): the OpenAI SDK's code, as the README
says, under an interpreter that has the SDK; where this one has not, `python3` and a first line
saying what to install. Pasting and running it is tests/cli/test_service_cli.py's."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from rocmforge_supervisor.cli._serve import usage_examples


def _program(lines: list[str]) -> tuple[str, str, str]:
    """The comment line, the heredoc's command line and the program between it and EOF."""
    start = next(i for i, line in enumerate(lines) if line.endswith(" - <<'EOF'"))
    end = lines.index("EOF")
    return lines[start - 1], lines[start], "\n".join(lines[start + 1 : end])


@pytest.mark.parametrize("keyed", [False, True])
def test_the_example_is_the_openai_sdks_and_compiles(keyed: bool) -> None:
    comment, command, program = _program(usage_examples("http://127.0.0.1:8080", "m", keyed=keyed))
    compile(program, "<example>", "exec")
    assert "from openai import OpenAI" in program and 'base_url="http://127.0.0.1:8080/v1"' in program
    assert ('os.environ["FORGE_API_KEY"]' in program) is keyed
    assert comment.startswith("# Python, with the OpenAI SDK")
    assert command == f"{sys.executable} - <<'EOF'"  # this venv has the SDK (make setup installs it)
    assert "pip install" not in comment


def test_without_the_sdk_here_it_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "openai" else real(name, *a)
    )
    comment, command, _ = _program(usage_examples("http://127.0.0.1:8080", "m", keyed=False))
    assert command == "python3 - <<'EOF'" and comment.endswith("(pip install openai):")
