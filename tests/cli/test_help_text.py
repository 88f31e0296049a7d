"""Every command's ``--help`` shows the bracketed words its docstring and option help have
(``[models.NAME]``, ``[server]``…): typer renders help as rich markup, where an unescaped
``[word]`` is a style tag and vanishes ("MODEL may be a  of the config"). Walks every command of
the app, groups included, so a new command is checked without being listed here."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import typer.main
from typer.testing import CliRunner

from rocmforge_supervisor.cli.main import app

#: A bracketed word as the source writes it; ``\\[`` is rich's escape for a literal ``[``.
_BRACKETED = re.compile(r"\\?\[[^\[\]\n]+\]")
#: Box drawing and the like that rich puts around wrapped help.
_FRAME = re.compile(r"[│╭╮╰╯─]")


def _commands(group: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Every command under ``group`` (typer's click commands), with the words that run it."""
    yield path, group
    for name, sub in getattr(group, "commands", {}).items():
        yield from _commands(sub, (*path, name))


def _texts(command: Any) -> list[str]:
    texts = [command.help or ""]
    texts += [getattr(p, "help", None) or "" for p in command.params]
    return texts


def _words(text: str) -> set[str]:
    """The bracketed words of a help source, as they must print (an escape's ``\\`` dropped)."""
    return {w.removeprefix("\\") for w in _BRACKETED.findall(text)}


def _flat(text: str) -> str:
    return " ".join(_FRAME.sub(" ", text).split())


def test_every_commands_help_keeps_its_bracketed_words() -> None:
    root = typer.main.get_command(app)
    runner = CliRunner()
    checked = 0
    for path, command in _commands(root):
        words = set().union(*(_words(t) for t in _texts(command)))
        result = runner.invoke(
            app, [*path, "--help"], env={"COLUMNS": "250", "NO_COLOR": "1", "TERM": "dumb"}
        )
        assert result.exit_code == 0, (path, result.output)
        shown = _flat(result.output)
        lost = sorted(w for w in words if _flat(w) not in shown)
        assert not lost, f"forge {' '.join(path)} --help lost {lost}:\n{result.output}"
        assert "\\[" not in shown, f"forge {' '.join(path)} --help shows an escape:\n{result.output}"
        checked += len(words)
    assert checked, "no bracketed words found at all: is the walk reading the help?"
