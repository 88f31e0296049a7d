"""Children that die with us: the exec wrapper both llama-server and rpc-server children use."""

from __future__ import annotations

import os
import shutil
import sys

__all__ = ["with_parent_death"]

# The fallback where util-linux's setpriv is missing: set PR_SET_PDEATHSIG, check the parent did
# not die before it was set, then exec the real command (same pid, same process group).
_SHIM = (
    "import ctypes,os,signal,sys;"
    "ctypes.CDLL(None,use_errno=True).prctl(1,signal.SIGKILL);"
    "os.getppid()==int(sys.argv[1]) or os._exit(1);"
    "os.execv(sys.argv[2],sys.argv[2:])"
)


def with_parent_death(args: list[str]) -> list[str]:
    """``args`` wrapped so the child gets SIGKILL when this process dies (``PR_SET_PDEATHSIG``),
    even when it is SIGKILLed and no cleanup of ours runs."""
    if not sys.platform.startswith("linux"):
        return args
    setpriv = shutil.which("setpriv")
    if setpriv:
        return [setpriv, "--pdeathsig", "KILL", "--", *args]
    return [sys.executable, "-c", _SHIM, str(os.getpid()), *args]
