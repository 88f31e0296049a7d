"""How a child's start or life ended, and what to say about it: the states, the exit status in
words, the advice for a CPU fault, the hint for each start failure reason. Shared by every kind
of child; it imports nothing of process/ (the kinds and the spec import it)."""

from __future__ import annotations

import signal
from typing import Literal

__all__ = [
    "AMX_SIGILL_ADVICE",
    "START_HINTS",
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


def unwrap_group(exc: BaseException) -> BaseException:
    """A start failure inside a task group arrives as an ExceptionGroup of one: hand out the one."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc
