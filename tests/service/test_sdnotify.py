"""sd_notify against real AF_UNIX datagram sockets, the way systemd listens (path and abstract)."""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from rocmforge_supervisor.config import ForgeSettings
from rocmforge_supervisor.process import SdNotifier


class Listener:
    """A bound datagram socket standing where systemd's notify socket would be."""

    def __init__(self, address: str | bytes, name: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(address)
        self.sock.settimeout(5.0)  # a deadline, not a sleep: recv returns as soon as a datagram lands
        self.name = name  # what NOTIFY_SOCKET would say

    def recv(self) -> dict[str, str]:
        data = self.sock.recv(4096).decode()
        return dict(line.split("=", 1) for line in data.split("\n"))

    def recv_raw(self) -> str:
        return self.sock.recv(4096).decode()

    def assert_nothing_pending(self) -> None:
        self.sock.setblocking(False)
        try:
            with pytest.raises(BlockingIOError):
                self.sock.recv(4096)
        finally:
            self.sock.settimeout(5.0)


@pytest.fixture
def path_listener() -> Iterator[Listener]:
    # AF_UNIX paths are limited to 108 bytes: tmp_path can be longer than that.
    short = Path("/tmp") / f"forge-notify-{uuid.uuid4().hex[:8]}.sock"
    lst = Listener(str(short), str(short))
    yield lst
    lst.sock.close()
    short.unlink(missing_ok=True)


@pytest.fixture
def abstract_listener() -> Iterator[Listener]:
    name = f"forge-test-{uuid.uuid4().hex}"
    lst = Listener(b"\0" + name.encode(), "@" + name)
    yield lst
    lst.sock.close()


@pytest.fixture(params=["path", "abstract"])
def listener(
    request: pytest.FixtureRequest, path_listener: Listener, abstract_listener: Listener
) -> Listener:
    return path_listener if request.param == "path" else abstract_listener


def test_messages_arrive_as_sent(listener: Listener) -> None:
    n = SdNotifier(listener.name)
    assert n.enabled
    assert n.ready("serving 2 models")
    assert listener.recv() == {"READY": "1", "STATUS": "serving 2 models"}
    assert n.status("loading gemma")
    assert listener.recv() == {"STATUS": "loading gemma"}
    assert n.watchdog()
    assert listener.recv() == {"WATCHDOG": "1"}
    assert n.stopping()
    assert listener.recv() == {"STOPPING": "1"}
    assert n.send("READY=1\nSTATUS=raw")
    assert listener.recv_raw() == "READY=1\nSTATUS=raw"
    assert n.extend_timeout(2.5)
    assert listener.recv() == {"EXTEND_TIMEOUT_USEC": "2500000"}
    listener.assert_nothing_pending()


def test_reloading_carries_monotonic_usec(listener: Listener) -> None:
    n = SdNotifier(listener.name)
    before = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    assert n.reloading()
    after = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    msg = listener.recv()
    assert set(msg) == {"RELOADING", "MONOTONIC_USEC"}
    assert msg["RELOADING"] == "1"
    assert before <= int(msg["MONOTONIC_USEC"]) <= after
    assert n.reloading("reloading forge.toml")
    assert listener.recv()["STATUS"] == "reloading forge.toml"


def test_values_cannot_inject_assignments(listener: Listener) -> None:
    n = SdNotifier(listener.name)
    n.status("line one\nREADY=1")
    assert listener.recv() == {"STATUS": "line one READY=1"}


def test_notify_upper_cases_keys(listener: Listener) -> None:
    SdNotifier(listener.name).notify(status="x", mainpid=os.getpid())
    assert listener.recv() == {"STATUS": "x", "MAINPID": str(os.getpid())}


def test_disabled_without_notify_socket() -> None:
    n = SdNotifier.from_settings(ForgeSettings(notify_socket=None))
    assert not n.enabled
    assert not n.ready("x") and not n.watchdog() and not n.reloading() and not n.stopping()
    assert not SdNotifier("").enabled
    assert not SdNotifier("vsock:2:1234").enabled  # not supported: off, not a crash


def test_send_failure_never_raises(tmp_path: Path) -> None:
    gone = SdNotifier(str(tmp_path / "nobody-listens.sock"))
    assert gone.enabled
    assert gone.ready() is False
    assert SdNotifier("@forge-no-such-abstract-socket-" + uuid.uuid4().hex).watchdog() is False


def test_from_settings_reads_the_systemd_variables(path_listener: Listener) -> None:
    settings = ForgeSettings.model_validate(
        {"NOTIFY_SOCKET": path_listener.name, "WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(os.getpid())}
    )
    n = SdNotifier.from_settings(settings)
    assert n.enabled and n.watchdog_interval == 15.0
    n.watchdog()
    assert path_listener.recv() == {"WATCHDOG": "1"}


def test_watchdog_interval() -> None:
    me = os.getpid()
    assert SdNotifier("@x", 30_000_000, None).watchdog_interval == 15.0
    assert SdNotifier("@x", 30_000_000, me).watchdog_interval == 15.0
    assert SdNotifier("@x", 1_000_000, me).watchdog_interval == 0.5
    assert SdNotifier("@x", 30_000_000, me + 1).watchdog_interval is None  # meant for another process
    assert SdNotifier("@x", None, None).watchdog_interval is None
    assert SdNotifier("@x", 0, None).watchdog_interval is None
