"""The environment a llama-server child runs with.

A user's shell must not silently change a child: llama-server reads every flag from ``LLAMA_ARG_*``,
its API key from ``LLAMA_API_KEY``, becomes a router child under ``LLAMA_SERVER_ROUTER_PORT``,
moves its port under ``AIP_MODE`` and reads ``~/.config/llama.cpp/config.ini``. All of those are
removed or neutralised here; then the device mask from placement is applied on top.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

__all__ = ["clean_child_env"]

_DROP_EXACT = frozenset(
    {
        "LLAMA_API_KEY",
        "LLAMA_SERVER_ROUTER_PORT",
        "LLAMA_SERVER_CHILD_MODE",
        "AIP_MODE",
        "AIP_HTTP_PORT",
        "LLAMA_CACHE",
        "LLAMA_SERVER_SLOTS_DEBUG",
        "HF_TOKEN",
        "FORGE_API_KEY",  # the gateway's secret
        "NOTIFY_SOCKET",  # systemd talks to the supervisor, not to its children
        "WATCHDOG_USEC",
        "WATCHDOG_PID",  # the child never downloads (we pass -m): keep the secret out of it
    }
)
_DROP_PREFIXES = ("LLAMA_ARG_",)


def clean_child_env(
    parent: Mapping[str, str], *, mask: Mapping[str, str | None], config_home: Path
) -> dict[str, str]:
    """``parent`` minus what could reconfigure llama-server, plus ``mask`` (None = remove)."""
    env = {k: v for k, v in parent.items() if k not in _DROP_EXACT and not k.startswith(_DROP_PREFIXES)}
    env["XDG_CONFIG_HOME"] = str(config_home)  # an empty dir: no user config.ini reaches the child
    env.setdefault("NO_COLOR", "1")
    for key, value in mask.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env
