"""Free loopback ports.

The OS picks the port (bind to 0), so two supervisors never choose the same one by scheme; the
small window between closing our probe socket and the child binding it is covered by the caller
retrying on the child's ``couldn't bind`` log line.
"""

from __future__ import annotations

import socket

__all__ = ["free_port", "port_is_free"]


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True
