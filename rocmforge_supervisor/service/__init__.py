"""`forge serve`: the gateway (one OpenAI-compatible endpoint), control API, metrics, systemd.

What the CLI uses of it is exported here, and only here (an import-linter contract keeps
``cli/`` out of the private modules).

Names are imported on first use (start-up time): ``forge ps`` finds a running service through
``_info`` and must not import the server (uvicorn, starlette, the supervisor) to do it.
"""

from .._lazy import lazy_getattr

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ._app import GatewayState, create_app
    from .core._logging import setup_logging
    from .ops._client import ServiceClient
    from .ops._info import find_service, read_service_info
    from .ops._server import loop_options, run_service
else:  # mypy sees the imports above (and flags a name that is not there)
    __getattr__ = lazy_getattr(
        __name__,
        {
            "._app": ("GatewayState", "create_app"),
            ".ops._client": ("ServiceClient",),
            ".ops._info": ("find_service", "read_service_info"),
            ".core._logging": ("setup_logging",),
            ".ops._server": ("loop_options", "run_service"),
        },
    )

__all__ = [
    "GatewayState",
    "ServiceClient",
    "create_app",
    "find_service",
    "loop_options",
    "read_service_info",
    "run_service",
    "setup_logging",
]
