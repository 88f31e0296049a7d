#!/usr/bin/env python3
"""A stand-in llama-server that behaves like the pinned llama-server on an Intel Xeon with AMX.

At the pinned llama.cpp, ggml's AMX kernels crash with SIGILL while loading a model whose weights
they repack (llama.cpp PR #26954): quantized types Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K, IQ4_XS.
``--no-repack`` avoids it. Unless ``--no-repack``/``-nr`` is given, this wrapper reads the model's
tensor types and, where any is one of those, dies of SIGILL as the real server does; otherwise it
execs the real binary (``.real/llama-server`` next to this file), so pids, signals and exit codes
are its own. Set up by scripts/ci/amx-sim.sh; standard library only (it runs with any python3).
"""

from __future__ import annotations

import os
import signal
import struct
import sys
from pathlib import Path
from typing import BinaryIO

REAL = Path(__file__).resolve().parent / ".real" / "llama-server"
AMX_TYPES = {2, 3, 8, 12, 13, 14, 23}  # ggml_type ids of the types the AMX buffer repacks
SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}  # GGUF kv type → size


def _read(f: BinaryIO, fmt: str) -> tuple[int, ...]:
    size = struct.calcsize("<" + fmt)
    data = f.read(size)
    if len(data) != size:
        raise ValueError("truncated")
    return struct.unpack("<" + fmt, data)


def _skip_value(f: BinaryIO, t: int) -> None:
    if t in SCALAR:
        f.seek(SCALAR[t], 1)
    elif t == 8:  # string
        (n,) = _read(f, "Q")
        f.seek(n, 1)
    elif t == 9:  # array
        (et, n) = _read(f, "IQ")
        if et in SCALAR:
            f.seek(SCALAR[et] * n, 1)
        else:
            for _ in range(n):
                _skip_value(f, et)
    else:
        raise ValueError(f"kv type {t}")


def tensor_types(path: str) -> set[int]:
    """The ggml types of a GGUF file's tensors (its header only)."""
    with Path(path).open("rb") as f:
        if f.read(4) != b"GGUF":
            raise ValueError("not gguf")
        (_version, n_tensors, n_kv) = _read(f, "IQQ")
        for _ in range(n_kv):
            _skip_value(f, 8)  # the key
            (t,) = _read(f, "I")
            _skip_value(f, t)
        types = set()
        for _ in range(n_tensors):
            _skip_value(f, 8)  # the name
            (n_dims,) = _read(f, "I")
            f.seek(8 * n_dims, 1)
            (t, _offset) = _read(f, "IQ")
            types.add(t)
        return types


def model_path(args: list[str]) -> str | None:
    for flag in ("-m", "--model"):
        if flag in args and args.index(flag) + 1 < len(args):
            return args[args.index(flag) + 1]
    return None


def main() -> None:
    args = sys.argv[1:]
    model = model_path(args)
    if model and "--no-repack" not in args and "-nr" not in args:
        try:
            hit = bool(tensor_types(model) & AMX_TYPES)
        except (OSError, ValueError):
            hit = False  # the real server reports a missing or broken file itself
        if hit:
            sys.stderr.write(
                "load_tensors: AMX model buffer size = 1.00 MiB\n"
                "simulated AMX: SIGILL in ggml's repacked AMX kernels (pass --no-repack)\n"
            )
            sys.stderr.flush()
            signal.signal(signal.SIGILL, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGILL)
    os.execv(REAL, [sys.argv[0], *args])


if __name__ == "__main__":
    main()
