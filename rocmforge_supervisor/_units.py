"""Byte counts for people: one spelling across placement refusals, ``forge doctor`` and the CLI."""

from __future__ import annotations

__all__ = ["format_bytes"]

_GIB = 1024**3
_MIB = 1024**2


def format_bytes(n: int) -> str:
    """``1.5 GiB`` from a GiB up, ``300 MiB`` below."""
    if abs(n) >= _GIB:
        return f"{n / _GIB:.1f} GiB"
    return f"{n / _MIB:.0f} MiB"
