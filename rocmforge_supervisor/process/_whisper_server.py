"""whisper.cpp's ``whisper-server`` as a :class:`ChildKind`: the third description on the one
lifecycle (``_child``), beside llama-server and rpc-server.

Its facts (whisper.cpp ``examples/server/server.cpp`` at the pinned v1.8.5): it loads the model
*before* it binds its port, so the first ``GET /health`` 200 means ready; a model it cannot read
ends in ``failed to initialize whisper context`` and exit 3; a port in use in ``couldn't bind to
server socket`` (classified ``bind``, so :class:`ModelServer`'s start retries on another port, as
for llama-server). Everything else of a model child — the port, the key file, the log, the stop —
is the same class, :class:`~._instance.ModelServer`, which picks this kind for
``InstanceSpec.program`` :data:`~._programs.WHISPER_SERVER`.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from ._child import HttpOk
from ._model_kind import ModelServerKind
from ._outcomes import crash_advice

__all__ = ["WhisperServerKind"]

_CLASSIFY: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("bind", re.compile(r"couldn't bind to server socket")),
    ("file_not_found", re.compile(r"failed to open '.*'|No such file or directory")),
    ("invalid_model", re.compile(r"failed to initialize whisper context|invalid model|bad magic")),
    ("bad_args", re.compile(r"error: unknown argument|error: unknown language|error: invalid")),
)

_HINTS = {
    "bind": "the port is in use: leave the port to forge",
    "file_not_found": "check the model path",
    "invalid_model": "the file is not a whisper.cpp model (ggml-*.bin): re-download it",
    "bad_args": "an extra whisper-server argument was rejected: check `args`",
    "illegal_instruction": "the CPU lacks an instruction this whisper-server was compiled for: "
    "`forge build --whisper --force` builds one for this machine",
    "crashed": "see the log lines above",
}


@dataclass(frozen=True)
class WhisperServerKind(ModelServerKind):
    """whisper-server: ready at its first ``/health`` 200 (it binds after the load)."""

    program: ClassVar[str] = "whisper-server"
    readiness: ClassVar[HttpOk] = HttpOk("/health")
    spawn_hint: ClassVar[str] = "run `forge build --whisper`, or check FORGE_WHISPER_SERVER"
    hints: ClassVar[Mapping[str, str]] = _HINTS
    default_hint: ClassVar[str | None] = "see its log"

    def classify(self, tail: list[str], returncode: int | None) -> str:
        if returncode == -signal.SIGILL:
            return "illegal_instruction"
        text = "\n".join(tail)
        return next((reason for reason, pattern in _CLASSIFY if pattern.search(text)), "crashed")

    def crash_cause(
        self, tail: list[str], returncode: int | None, *, computed: bool, amx: bool
    ) -> str | None:
        # Its SIGILL advice stays the build's: the AMX one names llama-server's workaround flag.
        return crash_advice(returncode, computed=computed, amx=amx and returncode != -signal.SIGILL)
