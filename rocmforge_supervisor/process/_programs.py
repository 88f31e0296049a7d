"""Which server program a model child runs: how its command line is built, which
:class:`~._child.ChildKind` describes it, what tells that it is ready, whether it takes forge's key.

One value per kind of model server on :attr:`InstanceSpec.program`; the rest of a child's life is
the same :class:`~._instance.ModelServer` for all of them, so nothing in ``process/`` asks which
backend a model has. The servers forge builds are here, since their build's self-test (``binaries/``)
runs them too: llama-server's (:data:`LLAMA_SERVER`, the default) and whisper-server's
(:data:`WHISPER_SERVER`); a user's command is its backend's (``supervisor/backends/command``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from .._argv import server_argv
from .._whisper_argv import whisper_argv
from ._child import ChildKind, Readiness
from ._llama_kind import LlamaServerKind
from ._whisper_server import WhisperServerKind

__all__ = ["LLAMA_SERVER", "WHISPER_SERVER", "KnownServer", "ServerProgram", "SpecFields"]


class SpecFields(Protocol):
    """What a program reads of the :class:`~._spec.InstanceSpec` it runs (which holds its program:
    a protocol here, so neither module imports the other back)."""

    @property
    def binary(self) -> Path: ...
    @property
    def model_path(self) -> Path: ...
    @property
    def alias(self) -> str: ...
    @property
    def host(self) -> str: ...
    @property
    def ctx_size(self) -> int | None: ...
    @property
    def n_gpu_layers(self) -> int | str | None: ...
    @property
    def parallel(self) -> int | None: ...
    @property
    def cpu_only(self) -> bool: ...
    @property
    def verbosity(self) -> int | None: ...
    @property
    def extra_args(self) -> Sequence[str]: ...
    @property
    def log_path(self) -> Path | None: ...
    def amx_unprotected(self) -> bool: ...


class ServerProgram(Protocol):
    """What a model child's program is, to the one lifecycle."""

    @property
    def takes_key(self) -> bool:
        """It reads forge's per-child key (``--api-key-file``); else it listens on loopback unkeyed."""
        ...

    def argv(self, spec: SpecFields, port: int, api_key_file: Path | None) -> list[str]: ...

    def kind(self, spec: SpecFields) -> ChildKind: ...

    def readiness(self) -> Readiness | None:
        """None: the kind's own."""
        ...

    def env(self) -> Mapping[str, str]:
        """Set on top of the cleaned environment (before the device mask)."""
        ...

    def liveness(self) -> tuple[str, bool]:
        """What the health watcher asks once it is ready: (path, whether any HTTP answer means
        alive rather than only a 200)."""
        ...


class KnownServer:
    """A server forge knows (llama-server, whisper-server): its kind's readiness, no extra
    environment, ``/health`` for liveness."""

    def readiness(self) -> Readiness | None:
        return None

    def env(self) -> Mapping[str, str]:
        return {}

    def liveness(self) -> tuple[str, bool]:
        return "/health", False


@dataclass(frozen=True)
class _LlamaServer(KnownServer):
    takes_key: bool = True

    def argv(self, spec: SpecFields, port: int, api_key_file: Path | None) -> list[str]:
        return server_argv(
            binary=spec.binary,
            model_path=spec.model_path,
            host=spec.host,
            port=port,
            alias=spec.alias,
            api_key_file=api_key_file,
            ctx_size=spec.ctx_size,
            cpu_only=spec.cpu_only,
            n_gpu_layers=spec.n_gpu_layers,
            parallel=spec.parallel,
            verbosity=spec.verbosity,
            extra_args=spec.extra_args,
        )

    def kind(self, spec: SpecFields) -> ChildKind:
        log_path = str(spec.log_path) if spec.log_path else None
        return LlamaServerKind(spec.alias, log_path, amx=spec.amx_unprotected())


@dataclass(frozen=True)
class _WhisperServer(KnownServer):
    takes_key: bool = False  # whisper-server has no API key

    def argv(self, spec: SpecFields, port: int, api_key_file: Path | None) -> list[str]:
        return whisper_argv(
            binary=spec.binary,
            model_path=spec.model_path,
            host=spec.host,
            port=port,
            cpu_only=spec.cpu_only,
            extra_args=spec.extra_args,
        )

    def kind(self, spec: SpecFields) -> ChildKind:
        return WhisperServerKind(spec.alias, str(spec.log_path) if spec.log_path else None)


LLAMA_SERVER: ServerProgram = _LlamaServer()
WHISPER_SERVER: ServerProgram = _WhisperServer()
