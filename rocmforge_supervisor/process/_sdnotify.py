"""sd_notify(3): tell systemd we are ready, reloading, stopping, alive (watchdog), and our status.

Hand-written on purpose: the protocol is one datagram of ``KEY=value`` lines to an AF_UNIX socket
(about 30 lines of code). The PyPI packages for it (``sdnotify``, ``systemd-python``,
``cysystemd``) are either unmaintained or need libsystemd headers and a C build, which is too much of
a dependency for what is a ``sendto``.

Every method is a no-op outside systemd (``NOTIFY_SOCKET`` unset) and never raises: a service must
not fail because its supervisor cannot be told something.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from typing import Self

from ..config import ForgeSettings

__all__ = ["SdNotifier"]

log = logging.getLogger(__name__)


class SdNotifier:
    """One service's channel to systemd. Build it with :meth:`from_settings`."""

    def __init__(
        self, notify_socket: str | None, watchdog_usec: int | None = None, watchdog_pid: int | None = None
    ) -> None:
        self._address = _address(notify_socket)
        self._watchdog_usec = watchdog_usec
        self._watchdog_pid = watchdog_pid

    @classmethod
    def from_settings(cls, settings: ForgeSettings) -> Self:
        return cls(settings.notify_socket, settings.watchdog_usec, settings.watchdog_pid)

    @property
    def enabled(self) -> bool:
        return self._address is not None

    @property
    def watchdog_interval(self) -> float | None:
        """Seconds between ``WATCHDOG=1`` pings (half the unit's WatchdogSec), or None: no watchdog.

        systemd sets ``WATCHDOG_PID`` to the main PID; a child that inherited the variables must not
        ping on our behalf.
        """
        if not self._watchdog_usec or self._watchdog_usec <= 0:
            return None
        if self._watchdog_pid is not None and self._watchdog_pid != os.getpid():
            return None
        return self._watchdog_usec / 2 / 1_000_000

    def send(self, message: str) -> bool:
        """Send one raw notification (``"READY=1\\nSTATUS=…"``). True if it was delivered."""
        if self._address is None:
            return False
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
                sock.connect(self._address)
                sock.sendall(message.encode())
        except OSError as exc:
            log.debug("sd_notify %r failed: %s", message, exc)
            return False
        return True

    def notify(self, **fields: str | int) -> bool:
        """``notify(READY=1, STATUS="serving 2 models")``: one datagram, one ``KEY=value`` per line."""
        lines = [f"{key.upper()}={_one_line(str(value))}" for key, value in fields.items()]
        return self.send("\n".join(lines))

    def ready(self, status: str | None = None) -> bool:
        if status is None:
            return self.notify(READY=1)
        return self.notify(READY=1, STATUS=status)

    def reloading(self, status: str | None = None) -> bool:
        """``RELOADING=1`` with ``MONOTONIC_USEC``, which systemd >= 253 requires for
        ``Type=notify-reload`` (and ignores otherwise). Send :meth:`ready` when the reload is done."""
        now_usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        if status is None:
            return self.notify(RELOADING=1, MONOTONIC_USEC=now_usec)
        return self.notify(RELOADING=1, MONOTONIC_USEC=now_usec, STATUS=status)

    def stopping(self, status: str | None = None) -> bool:
        if status is None:
            return self.notify(STOPPING=1)
        return self.notify(STOPPING=1, STATUS=status)

    def status(self, text: str) -> bool:
        return self.notify(STATUS=text)

    def watchdog(self) -> bool:
        return self.notify(WATCHDOG=1)

    def extend_timeout(self, seconds: float) -> bool:
        """Ask for more time to start or stop (``EXTEND_TIMEOUT_USEC``), e.g. while draining."""
        return self.notify(EXTEND_TIMEOUT_USEC=int(seconds * 1_000_000))


def _address(notify_socket: str | None) -> str | bytes | None:
    """``@name`` is a Linux abstract socket: a leading NUL byte instead of a path."""
    if not notify_socket:
        return None
    if notify_socket.startswith("@"):
        return b"\0" + notify_socket[1:].encode()
    if notify_socket.startswith("/"):
        return notify_socket
    log.debug("NOTIFY_SOCKET %r is neither a path nor @abstract (vsock is not supported)", notify_socket)
    return None


def _one_line(value: str) -> str:
    # A newline inside a value would start a new KEY=value assignment.
    return value.replace("\n", " ")
