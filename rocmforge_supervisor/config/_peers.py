"""``[peers.NAME]``: another server whose models this one serves too (another forge, any
OpenAI-compatible server, an Anthropic-compatible API).

A peer has no process here: forge forwards a request for one of its models to its URL with the
peer's own key, after the same checks as a local model's (the client's key and scope, its limits,
the activity log). The key is read from the environment (``api_key_env``) when a request needs it,
so it is never in the file, the logs, or a config dump.
"""

from __future__ import annotations

import os
import re
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ._explain import custom
from ._names import is_loopback

__all__ = ["PEER_APIS", "PeerApi", "PeerConfig", "PeerTimeouts", "fallback_problem"]

PeerApi = Literal["openai", "anthropic", "forge"]
PEER_APIS: tuple[PeerApi, ...] = ("openai", "anthropic", "forge")

#: A peer's own model ids are sent as they are; a served name is ``[prefix]id``.
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class PeerTimeouts(BaseModel):
    """``[peers.NAME.timeouts]``: seconds. A peer that exceeds one fails the request (a 504 or
    an error event) and is cooled down (``cooldown``) like a peer that refused the connection."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    connect: float = Field(default=5.0, gt=0)
    """Opening the connection (TLS included)."""
    first_byte: float = Field(default=120.0, gt=0)
    """From the request sent to the answer's headers (a cold model on the peer loads meanwhile)."""
    idle: float = Field(default=60.0, gt=0)
    """Between two chunks of a streamed answer."""


class PeerConfig(BaseModel):
    """``[peers.NAME]``: one peer server."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str = Field(min_length=1)
    """Its base URL, without ``/v1`` (``https://gpu-box:8443``, ``https://api.anthropic.com``)."""
    api: PeerApi = "openai"
    """What it speaks: ``openai`` (``/v1/chat/completions``…; vLLM, llama-server, LiteLLM, most
    clouds), ``anthropic`` (``/v1/messages`` only) or ``forge`` (another forge: OpenAI's routes
    and Anthropic's, and its models' states)."""
    api_key_env: str | None = None
    """The environment variable holding the peer's key, sent as its API wants it
    (``Authorization: Bearer`` or ``x-api-key``). The client's own key is never forwarded."""
    models: list[str] = Field(default_factory=lambda: ["*"])
    """Its model ids to serve; ``["*"]``: every one its ``/v1/models`` lists (refreshed)."""
    prefix: str = ""
    """Put before each of its model ids to make the served name (``"gpu/"``: ``gpu/qwen3``). A
    peer model is always reachable as ``NAME/ID`` too."""
    timeouts: PeerTimeouts = Field(default_factory=PeerTimeouts)
    max_concurrency: int = Field(default=8, ge=1)
    """Requests in flight to it at once; more wait in line, by priority, as for a local model."""
    cooldown: float = Field(default=30.0, ge=0)
    """Seconds a peer that failed (refused, timed out, a 5xx) is skipped by fallbacks and
    refused at once (the circuit breaker), before the next request tries it again."""
    refresh: float = Field(default=60.0, gt=0)
    """Seconds between two readings of its ``/v1/models`` (``models = ["*"]``, its states)."""
    insecure: bool = False
    """Allow ``http://`` to a host that is not loopback (the key and the prompts go in clear)."""
    set: dict[str, Any] = Field(default_factory=dict)
    """Request fields always set on requests to it (over the client's), as a variant's ``force``."""
    strip: list[str] = Field(default_factory=list)
    """Request fields removed before it gets them (parameters it refuses)."""

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        parts = urlsplit(value.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise custom("peer_url", f"{value!r} is not an http(s) URL: e.g. https://gpu-box:8443")
        if parts.query or parts.fragment:
            raise custom("peer_url", f"{value!r}: a peer URL has no query or fragment")
        path = parts.path.rstrip("/")
        if path.endswith("/v1"):
            path = path[: -len("/v1")]  # forge adds /v1/... itself
        return f"{parts.scheme}://{parts.netloc}{path}"

    @field_validator("api_key_env")
    @classmethod
    def _env_name(cls, value: str | None) -> str | None:
        if value is not None and not _ENV_NAME.match(value):
            raise custom(
                "peer_key",
                f"api_key_env = {value!r} is not an environment variable's name (e.g. GPU_BOX_KEY)",
            )
        return value

    @field_validator("models")
    @classmethod
    def _models(cls, value: list[str]) -> list[str]:
        if not value:
            raise custom(
                "peer_models", 'models is empty: list the peer\'s model ids, or ["*"] for all of them'
            )
        if "*" in value and len(value) > 1:
            raise custom("peer_models", 'models = ["*"] means all of them: list ids, or "*" alone')
        return value

    @model_validator(mode="after")
    def _clear_text(self) -> PeerConfig:
        host = urlsplit(self.url).hostname or ""
        if self.url.startswith("http://") and not is_loopback(host) and not self.insecure:
            raise custom(
                "peer_insecure",
                f"{self.url} is plain http to another host: the peer's key and every prompt would "
                "cross the network in clear; use https://, or set insecure = true",
            )
        return self

    @property
    def discovers(self) -> bool:
        return self.models == ["*"]

    def api_key(self) -> str | None:
        """The peer's key, read now (a rotated key is picked up without a reload); None when the
        peer takes none. A missing variable is the caller's error to report."""
        if self.api_key_env is None:
            return None
        return os.environ.get(self.api_key_env)


def fallback_problem(entry: str, models: set[str], peers: dict[str, PeerConfig]) -> str | None:
    """What is wrong with one ``fallback`` entry: a ``[models.*]`` name, or ``PEER/ID`` of a
    configured peer (an id it may list later: not checked against its list)."""
    if entry in models:
        return None
    peer, sep, model_id = entry.partition("/")
    if sep and model_id and peer in peers:
        listed = peers[peer].models
        if listed != ["*"] and model_id not in listed:
            return f"fallback {entry!r}: peer {peer!r} serves only {', '.join(listed)}"
        return None
    names = ", ".join(sorted(models)) or "none"
    known = ", ".join(sorted(peers)) or "none"
    return (
        f"fallback {entry!r} is neither a [models.*] name ({names}) nor PEER/MODEL of a "
        f"configured peer (peers: {known})"
    )
