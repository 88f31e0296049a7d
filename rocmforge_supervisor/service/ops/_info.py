"""Where a running ``forge serve`` listens: the ``service.json`` it keeps in its state directory.

A module of its own, light on imports, for start-up time: ``forge ps`` / ``unload`` / ``logs`` /
``load`` look for the service here, and with no service running (no file) they must not import
the server (uvicorn, starlette, the supervisor) or even httpx to find that out.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._client import ServiceClient

__all__ = ["ServiceInfo", "find_service", "read_service_info", "service_info_path"]

ServiceInfo = dict[str, Any]


def service_info_path(state_dir: Path) -> Path:
    return state_dir / "service.json"


def read_service_info(state_dir: Path) -> ServiceInfo | None:
    """Where a running ``forge serve`` listens (written at start, removed at exit)."""
    try:
        info = json.loads(service_info_path(state_dir).read_text())
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def find_service(
    state_dir: Path, *, url: str | None = None, api_key: str | None = None, tls_cert: Path | None = None
) -> ServiceClient | None:
    """The running service (from its ``service.json`` or an explicit URL), if it answers.

    Found by its file, an ``https://`` service must present the very certificate it was started
    with (``tls_cert`` in the file: :func:`~rocmforge_supervisor.client.pinned_context`). At an
    explicit URL, its certificate is checked against the public CAs and ``tls_cert`` (the config's
    ``server.tls_cert``), host name included."""
    verify: Any = True
    if url is None:
        info = read_service_info(state_dir)
        if info is None:
            return None
        url = str(info.get("url"))
        if url.startswith("https://") and info.get("tls_cert"):
            verify = _pinned(url, str(info["tls_cert"]))
    elif url.startswith("https://") and tls_cert is not None:
        verify = tls_cert
    from ._client import ServiceClient  # httpx: only when there is a service to talk to (start-up time)

    client = ServiceClient(url, api_key, verify=verify)
    if client.alive():
        return client
    client.close()
    return None


def _pinned(url: str, cert: str) -> Any:
    import ssl

    from ..._errors import ServiceError
    from ...client import pinned_context

    try:
        return pinned_context(cert)
    except (OSError, ssl.SSLError) as exc:
        raise ServiceError(
            f"the forge service at {url} serves TLS with {cert}, which cannot be used here: {exc}",
            hint="let this user read the file server.tls_cert names: the CLI checks the service's certificate against it",
        ) from exc
