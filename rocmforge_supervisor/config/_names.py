"""Shapes shared by the config file and the HTTP edge: what a model name may be, what is loopback."""

from __future__ import annotations

import ipaddress
import re

__all__ = ["MODEL_NAME", "is_loopback"]

#: Model names become URL path parts, metric labels and log file names.
MODEL_NAME = re.compile(r"[A-Za-z0-9._-]{1,128}")


def is_loopback(host: str) -> bool:
    """``localhost``, ``*.localhost`` and loopback addresses; any other name may resolve anywhere."""
    h = host.strip().strip("[]").lower()
    if h == "localhost" or h.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        return False  # a hostname: it may resolve anywhere, so it is not trusted as loopback
