"""What each ``backend`` of a ``[models.NAME]`` accepts: the config's side of the backends table.

Which key belongs to which backend is said by the key's class (``_llama_keys.LlamaKeys``,
``_command_keys.CommandKeys``); this module reads them from there. The behaviour of each backend
(how it is planned, placed, watched, which routes it serves) is ``supervisor``'s table
(``supervisor/backends/_backends.py``); the config can only say which names exist and which keys
mean something to which backend, so that a key set on a model whose server has no such setting is
refused by name instead of silently ignored. A test keeps the two tables' names the same.
"""

from __future__ import annotations

import re
import string
from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

from .._argv import is_owned_flag
from .._whisper_argv import whisper_owned_flag
from ._command_keys import CommandKeys
from ._llama_keys import LlamaKeys

if TYPE_CHECKING:
    from ._model_keys import ModelKeys

__all__ = [
    "BACKEND_NAMES",
    "CONFIGURABLE",
    "DEFAULT_COMMAND_ROUTES",
    "ONE_AT_A_TIME",
    "PLACEHOLDERS",
    "WITH_CONTEXT",
    "BackendName",
    "check_command",
    "key_problem",
    "owned_flag",
    "path_problem",
    "placeholders",
]

BackendName = Literal["llama", "whisper", "command", "peer"]
BACKEND_NAMES: tuple[BackendName, ...] = ("llama", "whisper", "command", "peer")

#: Backends a ``[models.NAME]`` section may name; a peer's models come from ``[peers.NAME]``.
CONFIGURABLE: tuple[BackendName, ...] = ("llama", "whisper", "command")

#: Backends whose models have a context of tokens: ``[supervisor] ctx_size`` and ``ctx_min`` apply.
WITH_CONTEXT: frozenset[BackendName] = frozenset({"llama"})

#: Backends whose server answers one request at a time (whisper-server holds a global mutex).
ONE_AT_A_TIME: frozenset[BackendName] = frozenset({"whisper"})

#: The placeholders a command's argv may use.
PLACEHOLDERS = ("PORT", "HOST", "MODEL", "NAME")

#: What a command serves unless its ``routes`` say otherwise: the OpenAI API's model routes.
DEFAULT_COMMAND_ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")


def owned_flag(backend: BackendName, arg: str) -> bool:
    """``arg`` is a flag forge sets itself on that backend's child (refused in ``args``)."""
    if backend == "whisper":
        return whisper_owned_flag(arg)
    if backend == "command":
        return False  # the user wrote the whole command line
    return is_owned_flag(arg)


def placeholders(cmd: Sequence[str]) -> set[str]:
    """The ``${NAME}`` placeholders a command line uses (a malformed one: none of its argument)."""
    names: set[str] = set()
    for arg in cmd:
        template = string.Template(arg)
        if template.is_valid():
            names.update(template.get_identifiers())
    return names


def check_command(
    cmd: Sequence[str], health: str | None, ready_log: str | None, routes: Sequence[str]
) -> str | None:
    """What is wrong with a command's keys, as one sentence with the fix; None when nothing."""
    if not cmd:
        return 'a backend = "command" model needs cmd = ["/path/to/server", "--port", "${PORT}", ...]'
    for arg in cmd:
        if not string.Template(arg).is_valid():
            return f"cmd argument {arg!r} has a malformed placeholder: use ${{PORT}}, ${{HOST}}, ${{MODEL}}, ${{NAME}} ($$ for a $)"
    names = placeholders(cmd)
    unknown = sorted(names - set(PLACEHOLDERS))
    if unknown:
        return f"cmd uses ${{{unknown[0]}}}, which forge does not fill in: the placeholders are " + ", ".join(
            f"${{{p}}}" for p in PLACEHOLDERS
        )
    if "PORT" not in names:
        return "cmd must pass ${PORT} to the server: forge chooses the port and proxies to it"
    if health is not None and ready_log is not None:
        return "set health (a path that answers 200 when ready) or ready_log (a line it prints), not both"
    if health is not None and not health.startswith("/"):
        return f"health {health!r} must be a path on the server, such as /health or /v1/models"
    if ready_log is not None:
        try:
            re.compile(ready_log)
        except re.error as exc:
            return f"ready_log {ready_log!r} is not a regular expression: {exc}"
    for route in routes:
        if not route.startswith("/v1/"):
            return f"routes entry {route!r} is not an OpenAI route (/v1/...): e.g. /v1/chat/completions"
    return None


def _asks(value: object, default: object, key: str) -> bool:
    """Whether a key's value asks the server for something: not its default, and not a value that
    asks for nothing (``0``, ``"auto"``, an empty list or table, ``workers = "never"``: configs
    that say them on any model have always been accepted). ``false`` asks where the default is
    unset: ``kv_unified = false`` splits the cache."""
    if value == default or (key, value) == ("workers", "never"):
        return False
    return isinstance(value, bool) or value not in (0, "auto", [], {})


def key_problem(model: ModelKeys) -> tuple[str, str] | None:
    """(kind, message) for a key set on a model whose backend has no such setting, or a
    command whose keys do not make a command; None when the model's keys fit its backend."""
    backend = model.backend
    if backend not in CONFIGURABLE:
        return "peer_backend", (
            f'backend = "{backend}" is not set on a [models.*] entry: list the server under '
            '[peers.NAME] (url = "...") and its models are served as NAME/MODEL'
        )
    if backend == "whisper":
        for arg in model.args:
            if owned_flag("whisper", arg):
                return (
                    "owned_flag",
                    f"{arg!r} is set by forge itself on a whisper child and cannot be passed in args",
                )
        if model.max_concurrency not in (None, 1):
            return "whisper_key", (
                'max_concurrency does not apply to a backend = "whisper" model: remove it '
                "(whisper-server serves one request at a time)"
            )
    if backend != "llama":
        server = "whisper-server" if backend == "whisper" else "the command"
        for key, field in LlamaKeys.model_fields.items():
            if _asks(getattr(model, key), field.get_default(call_default_factory=True), key):
                return f"{backend}_key", (
                    f'{key} does not apply to a backend = "{backend}" model: remove it '
                    f"({server} has no such setting; pass its own flags in args)"
                )
    if backend != "command":
        for key, field in CommandKeys.model_fields.items():
            if _asks(getattr(model, key), field.get_default(call_default_factory=True), key):
                return "command_key", (
                    f'{key} applies only to a backend = "command" model: remove it, or set backend = "command"'
                )
        return None
    problem = check_command(model.cmd, model.health, model.ready_log, model.command_routes)
    return ("command", problem) if problem is not None else None


#: What ``path`` is, per backend, for the error when it is missing.
_PATH_IS = {
    "llama": 'a GGUF file, an embedded model\'s name ("smollm2-135m") or "hf:org/repo:QUANT"',
    "whisper": 'a whisper.cpp model file ("ggml-tiny.en.bin", see forge pull --whisper) or "hf:org/repo:FILE"',
}


def path_problem(model: ModelKeys) -> tuple[str, str] | None:
    """(kind, message) for a model without the ``path`` its server needs: every llama and whisper
    model, and a command whose ``cmd`` passes ``${MODEL}``; None when it has one or needs none."""
    if model.path:
        return None
    if model.backend != "command":
        return (
            "path_required",
            f"Field required: a {model.backend} model needs path = {_PATH_IS[model.backend]}",
        )
    if "MODEL" in placeholders(model.cmd):
        return "path_required", (
            'Field required: cmd passes ${MODEL}, which stands for path: add path = "..." (what the command loads: '
            "a hub id, a folder or a file), or take ${MODEL} out of cmd"
        )
    return None
