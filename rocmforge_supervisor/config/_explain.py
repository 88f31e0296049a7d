"""Why a config is invalid, in one line: the dotted key, the reason, and where to fix it.

Every validation error of forge.toml, of a ``FORGE_*`` variable or of a CLI override becomes one
:class:`ConfigError` here, naming the file or the variable that set the value.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from pydantic_core import PydanticCustomError

from .._errors import ConfigError

__all__ = ["CONFIG_NAME", "custom", "fix_hint", "translate", "where"]

CONFIG_NAME = "forge.toml"

_SECRET_KEYS = frozenset({"api_key", "key"})
#: Our own error kinds: their messages already quote the value.
_CUSTOM_KINDS = frozenset(
    {
        "mmproj_reference",
        "residency",
        "fallback",
        "peer_url",
        "peer_key",
        "peer_models",
        "peer_insecure",
        "peer_name",
        "peer_backend",
        "gpu_layers",
        "gpu",
        "owned_flag",
        "insecure_bind",
        "backoff_order",
        "worker_address",
        "rpc_owned",
        "duplicate_worker",
        "vram_reserve",
        "key_entry",
        "duplicate_key",
        "tls_cert",
        "tls_key",
        "path_required",
    }
)
#: Errors raised by a section's model validator, and the key they are about.
_VALIDATOR_FIELD = {
    "insecure_bind": "host",
    "backoff_order": "restart_backoff_max",
    "duplicate_key": "keys",
    "tls_cert": "tls_cert",
    "tls_key": "tls_key",
    "path_required": "path",
    "peer_backend": "backend",
    "peer_insecure": "url",
}


def custom(kind: str, message: str, **ctx: Any) -> PydanticCustomError:
    """A validation error whose text is exactly ``message`` (no "Value error, " prefix).

    pydantic substitutes ``{name}`` only for names in ``ctx``, so braces in ``message`` are safe.
    """
    return PydanticCustomError(kind, message, ctx or None)


def where(source: Path | None, env_keys: Mapping[str, str], loc: tuple[str, ...]) -> str:
    var = _env_var_for(loc, env_keys)
    if var is not None:
        return f"config {var}"
    return f"config {source.name}" if source is not None else "config"


def fix_hint(source: Path | None, env_keys: Mapping[str, str], loc: tuple[str, ...], verb: str) -> str:
    var = _env_var_for(loc, env_keys)
    if var is not None:
        return f"{verb} in the environment variable {var}"
    if source is not None:
        return f"{verb} in {source}"
    return f"{verb} in {CONFIG_NAME} or the FORGE_* environment"


def _env_var_for(loc: tuple[str, ...], env_keys: Mapping[str, str]) -> str | None:
    """The variable that set the value at ``loc``, if one did (the most specific one)."""
    for i in range(len(loc), 0, -1):
        name = "forge_" + "__".join(loc[:i]).lower()
        if name in env_keys:
            return env_keys[name]
    if loc[:2] == ("server", "api_key") and "forge_api_key" in env_keys:
        return env_keys["forge_api_key"]
    deeper = "forge_" + "__".join(loc).lower() + "__"
    return next((var for name, var in sorted(env_keys.items()) if name.startswith(deeper)), None)


def _describe(
    err: Any, prefix: tuple[str, ...], known_keys: Callable[[tuple[str, ...]], list[str]]
) -> tuple[tuple[str, ...], str, str]:
    """One pydantic error as (dotted location, reason, the verb of its fix)."""
    loc = (*prefix, *(str(p) for p in err["loc"]))
    kind = err["type"]
    reason = err["msg"]
    verb = "fix the value"
    if kind in _VALIDATOR_FIELD:  # a model validator's error: point at the key to change
        loc = (*loc, _VALIDATOR_FIELD[kind])
    if kind == "rpc_owned":  # the whole config's validator: the model it is about is in ctx
        loc = (*loc, "models", str((err.get("ctx") or {}).get("model")), "args")
    at = (err.get("ctx") or {}).get("at")
    if at:  # the whole config's validator: the key it is about is in ctx
        loc = (*loc, *str(at).split("."))
    if kind == "extra_forbidden":
        reason = "unknown key"
        guess = difflib.get_close_matches(loc[-1], known_keys(loc[:-1]), n=1)
        if guess:
            reason += f" — did you mean {guess[0]!r}?"
        verb = "remove it or fix the spelling"
    elif kind in ("missing", "path_required"):
        verb = "add it"
    elif kind in ("model_type", "model_attributes_type", "dict_type"):
        reason = "Input should be a table (a [section] or {key = value} in TOML)"
    quote_input = kind not in _CUSTOM_KINDS and kind not in ("extra_forbidden", "missing")
    if quote_input and loc and loc[-1] not in _SECRET_KEYS and _is_scalar(err.get("input")):
        reason += f" (got {err['input']!r})"
    return loc, reason, verb


def translate(
    exc: ValidationError,
    prefix: tuple[str, ...],
    *,
    source: Path | None,
    env_keys: Mapping[str, str],
    overrides: Mapping[str, Any] | None = None,
    known_keys: Callable[[tuple[str, ...]], list[str]],
) -> ConfigError:
    """pydantic's errors → one line: the first one's dotted key, reason and where to fix it, then
    every other one by key and reason (a bare "and 2 more" sent the user back for two more runs)."""
    errors = exc.errors(include_url=False)
    err = errors[0]
    kind = err["type"]
    loc, reason, verb = _describe(err, prefix, known_keys)
    key = ".".join(loc)
    others = [_describe(e, prefix, known_keys) for e in errors[1:]]
    more = f" (and {len(others)} more: " + "; ".join(f"{'.'.join(o[0])}: {o[1]}" for o in others) + ")"
    more = more if others else ""
    if overrides is not None and loc[1:2] and loc[1] in overrides:
        option = f"--{loc[1].replace('_', '-')}"
        place, hint = f"the {option} option", f"fix the {option} option"
    else:
        place, hint = where(source, env_keys, loc), fix_hint(source, env_keys, loc, verb)
    if kind == "insecure_bind":
        in_file = f" in {source}" if source is not None else ""
        hint = (
            f"set api_key in [server]{in_file} (or FORGE_API_KEY); or allow_unauthenticated = true "
            f"in [server]{in_file} if the network is trusted; or bind 127.0.0.1"
        )
    return ConfigError(f"{place}: {key}: {reason}{more}", key=key, hint=hint)


def _is_scalar(value: Any) -> bool:
    return isinstance(value, str | int | float | bool) and len(repr(value)) <= 80
