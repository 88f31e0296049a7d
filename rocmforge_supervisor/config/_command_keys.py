"""The keys of a ``[models.NAME]`` entry that only a user's command reads (``backend =
"command"``): its command line, how it says it is ready, what it serves, the memory it takes and
its environment.

Their own class for the same reason as ``_llama_keys.LlamaKeys``: set on another backend's model,
a key of this class is refused by name (``_backends.key_problem`` walks its fields).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BeforeValidator, Field

from ._fields import _bytes_or_none, _Section

__all__ = ["CommandKeys"]


class CommandKeys(_Section):
    """A command's keys of ``[models.NAME]``."""

    cmd: list[str] = Field(default_factory=list)
    """``backend = "command"``: the server's command line; ``${PORT}`` (required), ``${HOST}``,
    ``${MODEL}`` (``path``) and ``${NAME}`` are filled in at each start, ``args`` appended."""
    health: str | None = None
    """``backend = "command"``: the path that answers 200 once it is ready (default ``/health``)."""
    ready_log: str | None = None
    """``backend = "command"``: ready when it prints a line matching this regular expression
    (instead of ``health``)."""
    routes: list[str] | None = None
    """``backend = "command"``: the OpenAI routes it serves (default: chat/completions,
    completions, embeddings); a request on another route is refused before it is queued."""
    memory: Annotated[int | None, BeforeValidator(_bytes_or_none)] = None
    """``backend = "command"``: the device memory it takes on each device it is placed on
    (``"12GiB"``), for placement; None: placed without a memory check."""
    env: dict[str, str] = Field(default_factory=dict)
    """``backend = "command"``: extra environment for the command (the device mask is forge's)."""
