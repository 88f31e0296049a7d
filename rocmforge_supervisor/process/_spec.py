"""What a child is to run (:class:`InstanceSpec`), and how to say how it ended."""

from __future__ import annotations

import signal
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from .._argv import server_argv
from .._whisper_argv import whisper_argv

__all__ = [
    "AMX_SIGILL_ADVICE",
    "START_HINTS",
    "InstanceSpec",
    "InstanceState",
    "crash_advice",
    "describe_returncode",
    "unwrap_group",
]

InstanceState = Literal["new", "starting", "loading", "ready", "stopping", "exited"]

#: A portable (run-time dispatch) build or a rebuild on this machine: what SIGILL asks for where
#: the CPU has no AMX.
_SIGILL_ADVICE = (
    "the CPU refused an instruction this llama-server was compiled for (SIGILL): build one for this "
    "machine with `forge build --force`, or one for any x86-64 CPU with `forge build --portable`"
)

#: SIGILL on an AMX CPU from a child started without the self-test's workaround: a rebuild makes
#: the same binary and the same crash (ggml asks the kernel for AMX tile state on its main thread
#: only, PR #26954), so the advice is the flags, not ``forge build --force``.
AMX_SIGILL_ADVICE = (
    "this Intel CPU has AMX, whose ggml kernels die of SIGILL at this llama.cpp (PR #26954) unless "
    "the child runs with --no-repack; forge gives every child the flags its build self-test "
    "recorded, and this one ran without them: leave FORGE_SELFTEST on (or add --no-repack to the "
    "model's args), and see `forge doctor`"
)

#: What to do about a start failure, by its reason (:func:`classify_failure`'s classes).
START_HINTS = {
    "file_not_found": "check the model path",
    "invalid_model": "the file is not a loadable GGUF: re-download it or check `forge inspect`",
    "unsupported": "this llama-server does not know the model's architecture: update llama.cpp or use another model",
    "oom": "not enough device memory: lower --ctx-size or --n-gpu-layers, or use a smaller quant",
    "bind": "the port is in use: choose another --port or leave it unset",
    "timeout": "the load stalled or ran past its deadline: check the log; for very large models raise supervisor.load_stall_timeout or load_deadline_base / load_deadline_per_gib",
    "bad_args": "an extra llama-server argument was rejected: check `args` / the flags you passed",
    "rpc_worker": "an RPC worker is down or unreachable: check `forge worker` on that machine",
    "cancelled": "it was stopped on request",
    "crashed": "see the log lines above",
    "illegal_instruction": "the CPU lacks an instruction this llama-server was compiled for: "
    "`forge build --force` builds one for this machine, `forge build --portable` one for any x86-64",
    # The same death on an AMX CPU of a child without --no-repack (see AMX_SIGILL_ADVICE).
    "amx_fault": AMX_SIGILL_ADVICE,
}


def crash_advice(rc: int | None, *, computed: bool, amx: bool = False) -> str | None:
    """What a child's death by a CPU fault means, and what to do; None for other ends.

    ``computed``: the child had finished a computation before (a crash later is not the build's
    first-compute fault). ``amx``: this CPU has Intel AMX and the child ran without
    ``--no-repack``: ggml's AMX kernels crash at the pinned llama.cpp (PR #26954) without it.
    """
    if rc == -signal.SIGILL:
        return AMX_SIGILL_ADVICE if amx else _SIGILL_ADVICE
    if rc in (-signal.SIGSEGV, -signal.SIGBUS) and not computed:
        first = "it crashed in its first computation"
        if amx:
            return (
                f"{first}: this Intel CPU has AMX, whose ggml kernels crash at this llama.cpp "
                "(PR #26954); add --no-repack to the model's args, or run `forge doctor`, whose "
                "build self-test finds the flags that work"
            )
        return f"{first}: run `forge doctor` (it self-tests the build on this machine) and see the log"
    return None


def describe_returncode(rc: int | None) -> str:
    if rc is None:
        return "still running"
    if rc < 0:
        try:
            return f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exited with code {rc}"


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
    backend: Literal["llama", "whisper"] = "llama"
    """Which server ``binary`` is: the argv is built for it (readiness is ``/health`` 200 for both)."""
    amx: bool = False
    """This CPU has Intel AMX (its ggml kernels die at the pin unless ``--no-repack`` is given):
    what a CPU fault of the child means."""

    def amx_unprotected(self) -> bool:
        """An AMX CPU and a child without ``--no-repack``: a SIGILL is ggml's AMX defect."""
        return self.amx and not any(a in ("-nr", "--no-repack") for a in self.extra_args)

    def args(self, port: int, api_key_file: Path) -> list[str]:
        if self.backend == "whisper":
            return whisper_argv(
                binary=self.binary,
                model_path=self.model_path,
                host=self.host,
                port=port,
                cpu_only=self.cpu_only,
                extra_args=self.extra_args,
            )
        return server_argv(
            binary=self.binary,
            model_path=self.model_path,
            host=self.host,
            port=port,
            alias=self.alias,
            api_key_file=api_key_file if self.api_key != "" else None,
            ctx_size=self.ctx_size,
            cpu_only=self.cpu_only,
            n_gpu_layers=self.n_gpu_layers,
            parallel=self.parallel,
            verbosity=self.verbosity,
            extra_args=self.extra_args,
        )


def unwrap_group(exc: BaseException) -> BaseException:
    """A start failure inside a task group arrives as an ExceptionGroup of one: hand out the one."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc
