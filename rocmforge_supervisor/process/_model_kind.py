"""What the kinds of one-model servers (llama-server, whisper-server) share as a
:class:`~._child.ChildKind`: a failed start names the model and its log file, with the hint the
kind gives for the reason."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from .._errors import StartFailed
from ._child import ChildKind, ChildProcess

__all__ = ["ModelServerKind"]


@dataclass(frozen=True)
class ModelServerKind(ChildKind):
    """A server of one model (llama-server, whisper-server): its failures name the model and its
    log file, with the hint for the reason from the kind's own :attr:`hints`."""

    alias: str
    log_path: str | None = None

    hints: ClassVar[Mapping[str, str]] = {}
    #: The hint for a reason :attr:`hints` lacks.
    default_hint: ClassVar[str | None] = None

    def failure(self, reason: str, message: str, child: ChildProcess) -> StartFailed:
        return StartFailed(
            f"{self.program} for {self.alias!r} failed to start: {message}",
            hint=self.hints.get(reason, self.default_hint),
            returncode=child.returncode,
            reason=reason,
            stderr_tail=child.log.tail(15),
            log_path=self.log_path,
        )
