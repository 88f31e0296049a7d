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
    InvalidArgument,
    InvalidModelFile,
    ModelClosed,
    ModelCrashed,
    ModelNotFound,
    PlacementError,
    QueueFull,
    RequestError,
    RequestRejected,
    SelfTestFailed,
    ServerError,
    ServerUnavailable,
    ServiceError,
    SourceError,
    StartFailed,
    StreamError,
    ToolchainMissing,
    UsageError,
)
from ._lazy import lazy_getattr
from ._version import LLAMA_CPP_COMMIT, __version__

# Imported on first use (PEP 562), for start-up time: every `forge` command imports this package,
# and the client and supervisor pull in httpx, anyio, gguf and numpy, which most commands never use.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from .client import GenerateOptions, Message, TextModel, Token, Usage
    from .supervisor import LocalModel, aload_model, load_model
else:  # mypy sees the imports above (and flags a name that is not there)
    __getattr__ = lazy_getattr(
        __name__,
        {
            ".client": ("GenerateOptions", "Message", "TextModel", "Token", "Usage"),
            ".supervisor": ("LocalModel", "aload_model", "load_model"),
        },
    )

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
    "InvalidArgument",
    "InvalidModelFile",
    "LocalModel",
    "Message",
    "ModelClosed",
    "ModelCrashed",
    "ModelNotFound",
    "PlacementError",
    "QueueFull",
    "RequestError",
    "RequestRejected",
    "SelfTestFailed",
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
