"""Freeze ONE thread of another process, as a wedged decode does, while its other threads run.

A SIGSTOP stops every thread (the HTTP thread too, so ``/health`` would fail and the old hang
check would catch it). A wedge in llama.cpp (#27388) stops only the task loop, which runs on the
process's main thread (tid == pid), while the HTTP thread keeps answering. ``PTRACE_SEIZE`` +
``PTRACE_INTERRUPT`` on that one tid reproduces exactly that.

Run as a separate process (``python -m tests.support.freeze TID``): it prints ``frozen`` once the
thread has stopped and holds it (signals sent to it stay pending at its ptrace stop) until it
dies; then it collects the death as the tracer must (so the real parent, the supervisor, can reap
the child and see how it ended) and exits. Killing the freezer instead lets the thread go on.
"""

from __future__ import annotations

import ctypes
import os
import sys

PTRACE_SEIZE = 0x4206
PTRACE_INTERRUPT = 0x4207
WALL = 0x40000000


def main() -> None:
    tid = int(sys.argv[1])
    libc = ctypes.CDLL(None, use_errno=True)
    libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
    if libc.ptrace(PTRACE_SEIZE, tid, None, None) != 0:
        print(f"seize failed: {os.strerror(ctypes.get_errno())}", flush=True)
        sys.exit(1)
    if libc.ptrace(PTRACE_INTERRUPT, tid, None, None) != 0:
        print(f"interrupt failed: {os.strerror(ctypes.get_errno())}", flush=True)
        sys.exit(1)
    os.waitpid(tid, WALL)  # the group-stop/interrupt stop has happened: the thread is frozen
    print("frozen", flush=True)
    while True:  # every later stop (a signal's delivery) stays stopped: no PTRACE_CONT
        _, status = os.waitpid(tid, WALL)
        if os.WIFEXITED(status) or os.WIFSIGNALED(status):
            return


if __name__ == "__main__":
    main()
