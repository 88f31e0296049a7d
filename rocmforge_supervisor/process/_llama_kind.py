"""llama-server as a :class:`~._child.ChildKind`: its readiness, how its failures read, what its
crashes mean. Apart from :class:`~._instance.ModelServer` so that the programs table
(:mod:`._programs`) and the spec import it without the server class."""

from __future__ import annotations

import re
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from ._child import ChildProcess, HttpOk
from ._logs import LISTENING_RE, OOM_PATTERNS, classify_failure
from ._logs import crash_cause as cause_in_log
from ._model_kind import ModelServerKind
from ._outcomes import START_HINTS, crash_advice

__all__ = ["LlamaServerKind"]

#: A finished request's timing line (``slot print_timing: … prompt eval time``): it computed.
_COMPUTED_RE = re.compile(r"print_timing|prompt eval time")


@dataclass(frozen=True)
class LlamaServerKind(ModelServerKind):
    """llama-server, as a :class:`ChildKind`: it binds its port before it loads the model and
    answers ``/health`` 503 until then, so ready is a 200 (asked at once after ``listening on``);
    running out of device memory ends a load at once; its failures are read from its log."""

    program: ClassVar[str] = "llama-server"
    readiness: ClassVar[HttpOk] = HttpOk("/health", hurry=LISTENING_RE)
    spawn_hint: ClassVar[str] = "run `forge build`, or check FORGE_LLAMA_SERVER"
    hints: ClassVar[Mapping[str, str]] = START_HINTS
    fail_fast: ClassVar[tuple[tuple[str, re.Pattern[str], str], ...]] = (
        ("oom", OOM_PATTERNS, "out of device memory while loading"),
    )

    #: This CPU has AMX and the child runs without ``--no-repack`` (InstanceSpec.amx_unprotected):
    #: a SIGILL is ggml's AMX defect at the pin, which a rebuild does not fix.
    amx: bool = False

    def classify(self, tail: list[str], returncode: int | None) -> str:
        if returncode == -signal.SIGILL:
            return "amx_fault" if self.amx else "illegal_instruction"
        return classify_failure(tail)

    def crash_cause(
        self, tail: list[str], returncode: int | None, *, computed: bool, amx: bool
    ) -> str | None:
        # An RPC worker it placed layers on died; else a CPU fault says what it means: an
        # instruction this CPU lacks (SIGILL), or a crash in the first computation (the AMX defect
        # at the pin, when the self-test was skipped or overridden).
        return cause_in_log(tail) or crash_advice(returncode, computed=computed, amx=amx and self.amx)

    def on_line(self, line: str, child: ChildProcess) -> None:
        if "computed" not in child.flags and _COMPUTED_RE.search(line):
            child.flags.add("computed")
