"""`forge serve`: the gateway (one OpenAI-compatible endpoint), control API, metrics, systemd."""

from ._app import GatewayState, create_app
from ._client import ServiceClient, find_service
from ._config import ForgeConfig, ModelConfig, load_config
from ._server import read_service_info, run_service

__all__ = [
    "ForgeConfig",
    "GatewayState",
    "ModelConfig",
    "ServiceClient",
    "create_app",
    "find_service",
    "load_config",
    "read_service_info",
    "run_service",
]
