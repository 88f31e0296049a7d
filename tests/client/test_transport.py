"""The one upstream transport: httpx failures arrive as the package's typed errors."""

from __future__ import annotations

import socket
import struct

import anyio
import httpcore
import httpx
import pytest

from rocmforge_supervisor._errors import ServerUnavailable, StreamError
from rocmforge_supervisor.client._transport import (
    Upstream,
    asend,
    map_httpx_errors,
    send,
    socket_gone_as_httpx_error,
    sync_pool,
)


def _closed_port() -> int:
    """A port the OS just gave out and nobody listens on (connection refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def test_refused_connection_is_server_unavailable() -> None:
    up = Upstream(f"http://127.0.0.1:{_closed_port()}", "k")
    with sync_pool(httpx.Timeout(5.0)) as client, pytest.raises(ServerUnavailable, match="cannot reach"):
        send(client, up, "POST", "/v1/completions", content=b"{}", headers=up.headers())


@pytest.mark.anyio
async def test_async_refused_connection_is_server_unavailable() -> None:
    up = Upstream(f"http://127.0.0.1:{_closed_port()}", is_alive=lambda: False)
    async with httpx.AsyncClient() as client:
        with pytest.raises(ServerUnavailable) as info:
            await asend(client, up, "POST", "/x", content=b"", headers={})
    assert isinstance(info.value.__cause__, httpx.ConnectError)


def test_broken_stream_is_stream_error() -> None:
    up = Upstream("http://127.0.0.1:1")
    with pytest.raises(StreamError, match="broke") as info, map_httpx_errors(up, streaming=True):
        raise httpx.RemoteProtocolError("peer closed connection")
    assert isinstance(info.value.__cause__, httpx.RemoteProtocolError)


def test_upstream_headers_carry_the_key() -> None:
    assert Upstream("http://h", "k").headers({"A": "b"}) == {"Authorization": "Bearer k", "A": "b"}
    assert Upstream("http://h").headers() == {}
    assert Upstream("http://h/").url("/v1/x") == "http://h/v1/x"


def test_a_connection_reset_under_uvloop_is_a_connect_error_not_an_attribute_error() -> None:
    """Issue 19, 5: under uvloop a transport the peer reset has no socket any more, and asking the
    connection about itself (httpcore does, to check a pooled connection or to open one) raised
    ``AttributeError: 'NoneType' object has no attribute 'getpeername'`` from anyio — which once
    became a model's failure reason. Real uvloop, anyio and httpcore; a real reset."""

    async def reset_then_ask() -> None:
        with socket.socket() as srv:
            srv.bind(("127.0.0.1", 0))
            srv.listen()
            stream = await httpcore.AnyIOBackend().connect_tcp("127.0.0.1", srv.getsockname()[1])
            peer, _ = srv.accept()
            peer.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            peer.close()  # RST, as from a killed child
            with pytest.raises(httpcore.ReadError):
                await stream.read(100)
            with pytest.raises(AttributeError, match="getpeername"):  # the outside failure, as it is
                stream.get_extra_info("is_readable")
            mapped = pytest.raises(httpx.ConnectError, match="closed while it was being used")
            with mapped as info, socket_gone_as_httpx_error("http://127.0.0.1"):
                stream.get_extra_info("is_readable")
            assert isinstance(info.value.__cause__, AttributeError)
            await stream.aclose()

    anyio.run(reset_then_ask, backend_options={"use_uvloop": True})


def test_other_attribute_errors_stay_bugs() -> None:
    with pytest.raises(AttributeError), socket_gone_as_httpx_error("http://127.0.0.1"):
        _ = None.getpeername  # type: ignore[attr-defined]
