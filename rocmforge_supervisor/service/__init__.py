"""`forge serve`: the gateway (one OpenAI-compatible endpoint), control API, metrics, systemd."""

from ._app import GatewayState, create_app
from ._client import ServiceClient, find_service
from ._server import read_service_info, run_service

__all__ = [
    "GatewayState",
    "ServiceClient",
    "create_app",
    "find_service",
    "read_service_info",
    "run_service",
]
