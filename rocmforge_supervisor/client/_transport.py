"""The one way a request reaches a llama-server: retry on a stale keep-alive, translate httpx errors.

Both :class:`~rocmforge_supervisor.client.TextModel` (sync and async) and the gateway send through
here, so the retry rule and the meaning of every httpx failure are written once — as httpx itself
funnels httpcore's exceptions through ``map_httpcore_exceptions``.

Why the retry: llama-server (cpp-httplib) closes idle keep-alive connections after 5 s, httpx's
default pool expiry, so a request can be written on a connection the server is closing and fail
(``RemoteProtocolError``/``ReadError``) before any byte comes back (measured: about 1 in 10 streamed
requests a few seconds apart). Pools built here expire idle connections after 2 s, and a request
that failed before any byte of the response arrived is sent once more on a fresh connection —
unless the upstream process is known to be dead, when the caller wants the crash, not a retry.
"""

from __future__ import annotations

import json
import re
import ssl
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from .._errors import ServerUnavailable, StreamError

__all__ = [
    "KEEPALIVE_EXPIRY",
    "RETRYABLE",
    "Upstream",
    "Verify",
    "asend",
    "async_pool",
    "map_httpx_errors",
    "pinned_context",
    "send",
    "socket_gone_as_httpx_error",
    "sync_pool",
    "trust_context",
    "with_model",
]

#: How a client checks a server's certificate: httpx's own (``True``: the public CAs), a context,
#: or a PEM file of certificates to trust too (:func:`trust_context`).
Verify = ssl.SSLContext | str | Path | bool

KEEPALIVE_EXPIRY = 2.0  # well under cpp-httplib's 5 s idle close
#: Failures of a request that got no byte of a response: safe to send once more on a new connection.
RETRYABLE = (httpx.RemoteProtocolError, httpx.ConnectError, httpx.ReadError, httpx.WriteError)


def _always_alive() -> bool:
    return True


@dataclass(frozen=True)
class Upstream:
    """Where a request goes: a server's base URL, its key, and whether its process still lives.

    The supervisor hands this out for one acquired slot (not the process object): the HTTP layer
    may send to it and ask ``alive()``, nothing else. A peer (another server, no process here)
    also says how its key is sent, which of its model ids the body must name, and its timeouts.
    """

    base_url: str
    api_key: str | None = field(default=None, repr=False)
    is_alive: Callable[[], bool] = field(default=_always_alive, repr=False, compare=False)
    #: ``x-api-key`` for an Anthropic API; ``Authorization: Bearer`` otherwise.
    key_header: str = "authorization"
    #: A peer's own id of the model: written in the body's ``model`` (None: a local child).
    model: str | None = None
    #: A peer's name; None for a local child.
    peer: str | None = None
    #: (connect, first byte, idle) seconds for a peer; None: the pool's own.
    timeouts: tuple[float, float, float] | None = None
    #: A peer's request rules: fields set over the client's, fields removed.
    set_fields: Mapping[str, Any] = field(default_factory=dict)
    strip_fields: tuple[str, ...] = ()

    def peer_body(self, body: bytes) -> bytes:
        """A JSON request body as a peer takes it: its own model id, its ``set``/``strip`` rules
        (a body that is no JSON object goes as it is: the peer answers it)."""
        if self.model is None:
            return body
        return with_model(body, self.model, strip=self.strip_fields, force=self.set_fields)

    def alive(self) -> bool:
        return self.is_alive()

    def url(self, path: str) -> str:
        return f"{self.base_url.rstrip('/')}{path}"

    def headers(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        h: dict[str, str] = {}
        if self.api_key:
            if self.key_header == "x-api-key":
                h["x-api-key"] = self.api_key
            else:
                h["Authorization"] = f"Bearer {self.api_key}"
        if extra:
            h.update(extra)
        return h

    def timeout(self) -> httpx.Timeout | None:
        """A peer's timeouts as httpx's: ``read`` bounds the wait for the headers (the first
        byte); the gap between two chunks of a stream is the relay's to bound (``idle``)."""
        if self.timeouts is None:
            return None
        connect, first_byte, _idle = self.timeouts
        return httpx.Timeout(connect=connect, read=first_byte, write=first_byte, pool=connect)


def with_model(
    body: bytes, model: str, *, strip: tuple[str, ...] = (), force: Mapping[str, Any] | None = None
) -> bytes:
    """A JSON request body naming ``model``, ``strip`` removed and ``force`` set first; a body
    that is no JSON object goes as it is (its server answers it)."""
    try:
        payload = json.loads(body)
    except ValueError:
        return body
    if not isinstance(payload, dict):
        return body
    for name in strip:
        payload.pop(name, None)
    payload.update(force or {})
    payload["model"] = model
    return json.dumps(payload).encode()


def trust_context(cafile: str | Path) -> ssl.SSLContext:
    """The public CAs and the certificates in ``cafile`` (a self-signed server's own, or a private
    CA), the host name checked. A leaf certificate counts as a trust anchor by itself (OpenSSL's
    partial chain, as curl does), so ``cafile`` may be the very file the server serves."""
    ctx = httpx.create_ssl_context()  # httpx's own public CAs (certifi)
    ctx.load_verify_locations(cafile=str(cafile))
    ctx.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
    return ctx


_PEM_CERT = re.compile(r"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", re.DOTALL)


def pinned_context(cert_file: str | Path) -> ssl.SSLContext:
    """Trust exactly the first certificate of ``cert_file`` (a server's ``tls_cert``: its own
    certificate, then maybe its chain) and nothing else. The server must present that certificate
    and prove it holds its key, so the host name is not checked: the CLI reaches the local service
    at the address it bound (``0.0.0.0``, ``127.0.0.1``), which the certificate rarely names.
    OSError when the file cannot be read; ssl.SSLError when it holds no PEM certificate."""
    text = Path(cert_file).read_text(errors="replace")
    first = _PEM_CERT.search(text)
    if first is None:
        raise ssl.SSLError(f"{cert_file} holds no PEM certificate")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
    ctx.load_verify_locations(cadata=first.group(0))
    return ctx


def _verify(verify: Verify) -> ssl.SSLContext | bool:
    return trust_context(verify) if isinstance(verify, str | Path) else verify


def sync_pool(timeout: httpx.Timeout, *, verify: Verify = True) -> httpx.Client:
    """A connection pool whose idle connections expire before llama-server closes them."""
    return httpx.Client(
        timeout=timeout,
        limits=httpx.Limits(keepalive_expiry=KEEPALIVE_EXPIRY),
        trust_env=False,
        verify=_verify(verify),
    )


def async_pool(
    timeout: httpx.Timeout, *, max_keepalive: int = 20, verify: Verify = True
) -> httpx.AsyncClient:
    """The async twin of :func:`sync_pool` (the gateway asks for a larger keep-alive set)."""
    return httpx.AsyncClient(
        timeout=timeout,
        limits=httpx.Limits(
            max_connections=None, max_keepalive_connections=max_keepalive, keepalive_expiry=KEEPALIVE_EXPIRY
        ),
        trust_env=False,
        verify=_verify(verify),
    )


def _raised_by_anyio_socket_attributes(exc: AttributeError) -> bool:
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None:
        return False
    code = tb.tb_frame.f_code
    return code.co_name == "extra_attributes" and "anyio" in Path(code.co_filename).parts


@contextmanager
def socket_gone_as_httpx_error(url: str) -> Iterator[None]:
    """The one outside failure that escapes httpx's own mapping, mapped to what it is: the
    connection is gone (``httpx.ConnectError``).

    Under uvloop a transport that has closed (the peer reset it: a child killed while it was
    coming up) no longer has a socket, and anyio's socket attributes then raise
    ``AttributeError: 'NoneType' object has no attribute 'getpeername'``. httpcore asks for them
    when it opens a connection and when it checks whether a pooled one is still good, so the
    error came out of a plain ``client.get`` — and once became a model's failure reason.
    Only that error is mapped (recognised by where it was raised); any other
    AttributeError is a bug and stays one.
    """
    try:
        yield
    except AttributeError as exc:
        if not _raised_by_anyio_socket_attributes(exc):
            raise
        raise httpx.ConnectError(f"the connection to {url} closed while it was being used") from exc


def _unavailable(upstream: Upstream, exc: Exception) -> ServerUnavailable:
    if upstream.peer is not None:
        what = (
            f"did not answer in time ({type(exc).__name__})"
            if isinstance(exc, httpx.TimeoutException)
            else f"cannot be reached: {exc}"
        )
        return ServerUnavailable(
            f"peer {upstream.peer!r} at {upstream.base_url} {what}",
            hint="it is cooled down for a while (see `forge ps`); retry later, or use a local model",
        )
    return ServerUnavailable(
        f"cannot reach {upstream.base_url}: {exc}",
        hint="the server is not answering (restarting, or stopped); retry, or check `forge ps`",
    )


@contextmanager
def map_httpx_errors(upstream: Upstream, *, streaming: bool) -> Iterator[None]:
    """Translate httpx failures into the package's errors: before a response, the server could not
    be reached (``ServerUnavailable``); once the body is flowing, the stream broke (``StreamError``)."""
    try:
        yield
    except httpx.HTTPError as exc:
        if streaming:
            raise StreamError(f"the stream from {upstream.base_url} broke: {exc}") from exc
        raise _unavailable(upstream, exc) from exc


def send(
    client: httpx.Client,
    upstream: Upstream,
    method: str,
    path: str,
    *,
    content: bytes,
    headers: dict[str, str],
) -> httpx.Response:
    """Send and return the streaming response (headers read, body not); retried once if no byte came
    back and the upstream still lives. The caller must close the response."""
    for attempt in (1, 2):
        request = client.build_request(method, upstream.url(path), content=content, headers=headers)
        with map_httpx_errors(upstream, streaming=False):
            try:
                with socket_gone_as_httpx_error(upstream.base_url):
                    return client.send(request, stream=True)
            except RETRYABLE:
                if attempt == 2 or not upstream.alive():
                    raise
    raise AssertionError("unreachable")


async def asend(
    client: httpx.AsyncClient,
    upstream: Upstream,
    method: str,
    path: str,
    *,
    content: bytes,
    headers: dict[str, str],
) -> httpx.Response:
    """The async twin of :func:`send` (a peer's timeouts, when it has them, over the pool's)."""
    timeout = upstream.timeout()
    for attempt in (1, 2):
        request = (
            client.build_request(method, upstream.url(path), content=content, headers=headers)
            if timeout is None
            else client.build_request(
                method, upstream.url(path), content=content, headers=headers, timeout=timeout
            )
        )
        with map_httpx_errors(upstream, streaming=False):
            try:
                with socket_gone_as_httpx_error(upstream.base_url):
                    return await client.send(request, stream=True)
            except RETRYABLE:
                if attempt == 2 or not upstream.alive():
                    raise
    raise AssertionError("unreachable")
