"""The llama backend: a GGUF served by llama-server (its program is ``process``'s default, which the
build's self-test runs too), placed by its layers and context on GPUs, the CPU or RPC workers."""

from ....config import LlamaKeys
from .._entry import Backend
from ._plan import plan_llama

__all__ = ["BACKEND"]

BACKEND = Backend(
    "llama",
    "a llama-server model",
    "llama · language model",
    plan_llama,
    True,
    lambda _c: None,
    keys=LlamaKeys,
    gguf=True,
)
