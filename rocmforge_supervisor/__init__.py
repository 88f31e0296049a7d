"""rocmforge-supervisor: run llama.cpp's llama-server per GGUF model on AMD, NVIDIA or CPU.

::

    from rocmforge_supervisor import load_model, Message
    with load_model("smollm2-135m", ctx_size=4096) as model:
        for tok in model.generate("Once upon a time", max_tokens=64):
            print(tok.text, end="", flush=True)
"""

from ._errors import (
    BinaryNotFound,
    BuildError,
    ConfigError,
    ContextExceeded,
    ForgeError,
    HubError,
    InstanceError,
    InvalidModelFile,
    ModelCrashed,
    ModelNotFound,
    PlacementError,
    QueueFull,
    RequestError,
    RequestRejected,
    ServerError,
    ServerUnavailable,
    ServiceError,
    SourceError,
    StartFailed,
    StreamError,
    ToolchainMissing,
    UsageError,
)
from ._version import LLAMA_CPP_COMMIT, __version__

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .client import GenerateOptions, Message, TextModel, Token, Usage
    from .supervisor import LocalModel, aload_model, load_model

# Imported on first use (PEP 562), for start-up time: every `forge` command imports this package,
# and the client and supervisor pull in httpx, anyio, gguf and numpy, which most commands never use.
_LAZY = {
    "GenerateOptions": "client",
    "Message": "client",
    "TextModel": "client",
    "Token": "client",
    "Usage": "client",
    "LocalModel": "supervisor",
    "aload_model": "supervisor",
    "load_model": "supervisor",
}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "LLAMA_CPP_COMMIT",
    "BinaryNotFound",
    "BuildError",
    "ConfigError",
    "ContextExceeded",
    "ForgeError",
    "GenerateOptions",
    "HubError",
    "InstanceError",
    "InvalidModelFile",
    "LocalModel",
    "Message",
    "ModelCrashed",
    "ModelNotFound",
    "PlacementError",
    "QueueFull",
    "RequestError",
    "RequestRejected",
    "ServerError",
    "ServerUnavailable",
    "ServiceError",
    "SourceError",
    "StartFailed",
    "StreamError",
    "TextModel",
    "Token",
    "ToolchainMissing",
    "Usage",
    "UsageError",
    "__version__",
    "aload_model",
    "load_model",
]
