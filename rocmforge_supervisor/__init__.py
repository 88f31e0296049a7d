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
from .client import GenerateOptions, Message, TextModel, Token, Usage
from .supervisor import LocalModel, aload_model, load_model

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
