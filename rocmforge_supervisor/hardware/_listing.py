"""``llama-server --list-devices`` lines, parsed: the build's probe and the RPC worker discovery
both read them (here, below both, so that neither imports the other)."""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["ListedDevice", "parse_device_list"]

_DEVICE_RE = re.compile(r"^\s+(\w+?):\s+(.*?)\s+\((\d+) MiB,\s*(\d+) MiB free\)\s*$")


@dataclass(frozen=True)
class ListedDevice:
    """One line of ``llama-server --list-devices``: ``ROCm0: <name> (<total> MiB, <free> MiB free)``."""

    name: str
    description: str
    total_mib: int
    free_mib: int


def parse_device_list(text: str) -> list[ListedDevice]:
    """The device lines of ``llama-server --list-devices`` (and of rpc-server's banner)."""
    found: list[ListedDevice] = []
    for line in text.splitlines():
        dm = _DEVICE_RE.match(line)
        if dm:
            found.append(ListedDevice(dm[1], dm[2], int(dm[3]), int(dm[4])))
    return found
