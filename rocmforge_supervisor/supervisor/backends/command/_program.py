"""A user's command as a model server's program: ``cmd`` filled in (:func:`._server.command_argv`),
its readiness (a health route or a log line), its environment and liveness."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ....process import ChildKind, HttpOk, LogLine, Readiness, SpecFields
from ._server import CommandServerKind, command_argv

__all__ = ["CommandProgram"]


@dataclass(frozen=True)
class CommandProgram:
    """A user's OpenAI-compatible server (``backend = "command"``): ``cmd`` with ``${PORT}``,
    ``${HOST}``, ``${MODEL}``, ``${NAME}``; ready when ``GET health`` answers 200, or (``ready_log``)
    when it prints a matching line. ``spec.extra_args`` are appended (the model's ``args``)."""

    cmd: tuple[str, ...]
    health: str = "/health"
    ready_log: str | None = None
    extra_env: Mapping[str, str] = field(default_factory=dict)
    #: What ``${MODEL}`` becomes: the model's path as configured (not necessarily a file).
    model: str = ""
    takes_key: bool = False

    def argv(self, spec: SpecFields, port: int, api_key_file: Path | None) -> list[str]:
        filled = command_argv(self.cmd, port=port, host=spec.host, model=self.model, name=spec.alias)
        return [*filled, *spec.extra_args]

    def kind(self, spec: SpecFields) -> ChildKind:
        sign = f"the log line {self.ready_log!r}" if self.ready_log else f"GET {self.health} = 200"
        return CommandServerKind(spec.alias, str(spec.log_path) if spec.log_path else None, ready_sign=sign)

    def readiness(self) -> Readiness | None:
        if self.ready_log:
            return LogLine(re.compile(self.ready_log))
        return HttpOk(self.health)

    def env(self) -> Mapping[str, str]:
        return self.extra_env

    def liveness(self) -> tuple[str, bool]:
        # Ready by a log line: it may have no health route; any HTTP answer says it is not hung.
        return ("/", True) if self.ready_log else (self.health, False)
