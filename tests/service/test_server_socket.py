"""The gateway's own listening socket: connections accepted from it must not wait on Nagle.

The real accept path (asyncio's, as uvicorn uses it) is run on the socket ``_bind`` makes; the
accepted socket is asked for ``TCP_NODELAY``. With proto 0 this was off and every keep-alive
response after the first waited ~40 ms for the client's delayed ACK.
"""

from __future__ import annotations

import asyncio
import socket

from rocmforge_supervisor.service.ops._server import _bind


async def _accepted_nodelay() -> int:
    sock = _bind("127.0.0.1", 0)
    seen: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted: socket.socket = writer.get_extra_info("socket")
        seen.set_result(accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
        writer.close()

    server = await asyncio.start_server(handle, sock=sock)
    async with server:
        host, port = sock.getsockname()[:2]
        _, writer = await asyncio.open_connection(host, port)
        try:
            return await asyncio.wait_for(seen, timeout=10)
        finally:
            writer.close()


def test_accepted_connections_have_tcp_nodelay() -> None:
    assert asyncio.run(_accepted_nodelay()) != 0


def test_listening_socket_is_tcp_with_nodelay() -> None:
    sock = _bind("127.0.0.1", 0)
    try:
        assert sock.proto == socket.IPPROTO_TCP
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
    finally:
        sock.close()
