"""What a child is to run (:class:`InstanceSpec`); how a run ends is :mod:`._outcomes`."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ._outcomes import (
    AMX_SIGILL_ADVICE,
    START_HINTS,
    InstanceState,
    crash_advice,
    describe_returncode,
    unwrap_group,
)
from ._programs import LLAMA_SERVER, ServerProgram

__all__ = [
    "AMX_SIGILL_ADVICE",
    "START_HINTS",
    "InstanceSpec",
    "InstanceState",
    "crash_advice",
    "describe_returncode",
    "unwrap_group",
]


@dataclass
class InstanceSpec:
    """How to run one llama-server. ``None`` values are left to llama-server's own defaults."""

    binary: Path
    model_path: Path
    alias: str
    ctx_size: int | None = None
    n_gpu_layers: int | str | None = None  # int, "auto", "all"
    parallel: int | None = None
    extra_args: Sequence[str] = ()
    host: str = "127.0.0.1"
    port: int | None = None  # None: a free one, retried if the bind races
    mask: Mapping[str, str | None] = field(default_factory=dict)
    cpu_only: bool = False
    log_path: Path | None = None
    state_dir: Path | None = None
    """For the api-key file and the empty config home: the caller's (``FORGE_STATE_DIR``, the
    service's state dir). None: a private temporary directory, removed when the child is done."""
    stall_timeout: float = 300.0  # no output at all for this long while loading: give up
    ready_timeout: float | None = None  # overall cap on loading (None: only the stall timeout)
    stop_timeout: float = 10.0
    verbosity: int | None = None
    parent_env: Mapping[str, str] | None = None
    line_listeners: Sequence[Callable[[str], object]] = ()
    bind_retries: int = 3
    api_key: str | None = None  # None: a new random key per start; "": no key (loopback only)
    program: ServerProgram = LLAMA_SERVER
    """Which server ``binary`` runs (llama-server, whisper-server, a user's command): its argv,
    its kind, its readiness (:mod:`._programs`)."""
    amx: bool = False
    """This CPU has Intel AMX (its ggml kernels die at the pin unless ``--no-repack`` is given):
    what a CPU fault of the child means."""

    def amx_unprotected(self) -> bool:
        """An AMX CPU and a child without ``--no-repack``: a SIGILL is ggml's AMX defect."""
        return self.amx and not any(a in ("-nr", "--no-repack") for a in self.extra_args)

    def args(self, port: int, api_key_file: Path) -> list[str]:
        keyed = self.program.takes_key and self.api_key != ""
        return self.program.argv(self, port, api_key_file if keyed else None)
