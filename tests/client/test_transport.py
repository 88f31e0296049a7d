"""The one upstream transport: httpx failures arrive as the package's typed errors."""

from __future__ import annotations

import socket

import httpx
import pytest

from rocmforge_supervisor._errors import ServerUnavailable, StreamError
from rocmforge_supervisor.client._transport import Upstream, asend, map_httpx_errors, send, sync_pool


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
