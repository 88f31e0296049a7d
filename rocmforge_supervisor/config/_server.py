"""``[server]`` and its ``[[server.keys]]``: how the service listens, who may call it, and the
limits of what a request may send.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    BeforeValidator,
    Field,
    PrivateAttr,
    SecretStr,
    field_validator,
    model_validator,
)

from ._explain import custom
from ._fields import _empty_is_none, _Section
from ._names import is_loopback
from ._tls import tls_pair_problem

__all__ = ["KeyConfig", "ServerConfig"]


class KeyConfig(_Section):
    """``[[server.keys]]``: one client's API key, the models it may use, and its limits.

    The key itself comes from exactly one of ``key``, ``key_file`` (its first line) or ``env``
    (an environment variable's name), so that it can stay out of the file; it is read here, once
    per load or reload, and only :attr:`secret` gives it out. Logs and errors name ``name``.
    """

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.@-]*$")
    key: Annotated[SecretStr | None, BeforeValidator(_empty_is_none)] = None
    key_file: Path | None = None
    env: str | None = None
    models: list[str] = Field(default_factory=lambda: ["*"])
    """Model names or globs (``qwen*``) this key may use; default all."""
    admin: bool = False
    """Control routes (load, unload, add, reload, pull), the page's controls and captured bodies."""
    requests_per_minute: int | None = None
    tokens_per_day: int | None = None
    """Prompt + completion tokens in the last 24 hours."""
    priority: Literal["interactive", "batch", "background"] = "interactive"
    """Its requests' admission class; an ``X-Priority`` header may lower it (an admin key's may
    also raise it)."""

    _secret: str = PrivateAttr(default="")

    @property
    def secret(self) -> str:
        return self._secret

    @model_validator(mode="after")
    def _resolve(self) -> KeyConfig:
        entry = f"[[server.keys]] entry {self.name!r}"
        sources = [s for s in ("key", "key_file", "env") if getattr(self, s) is not None]
        if len(sources) != 1:
            raise custom(
                "key_entry",
                f"{entry} needs exactly one of key, key_file or env"
                + (f" (it has {', '.join(sources)})" if sources else ""),
            )
        if not self.models:
            raise custom(
                "key_entry",
                f'{entry}: models is empty (leave it out for all models, or list names or globs like "qwen*")',
            )
        for limit in ("requests_per_minute", "tokens_per_day"):
            value = getattr(self, limit)
            if value is not None and value <= 0:
                raise custom(
                    "key_entry", f"{entry}: {limit} must be above 0 (got {value}; leave it out for no limit)"
                )
        if self.key is not None:
            secret = self.key.get_secret_value()
        elif self.key_file is not None:
            try:
                lines = self.key_file.expanduser().read_text().splitlines()
            except OSError as exc:
                raise custom(
                    "key_entry",
                    f"{entry}: key_file {str(self.key_file)!r} cannot be read: {exc.strerror or exc}",
                ) from None
            secret = lines[0].strip() if lines else ""
            if not secret:
                raise custom("key_entry", f"{entry}: key_file {str(self.key_file)!r} is empty")
        else:
            secret = os.environ.get(str(self.env), "").strip()
            if not secret:
                raise custom("key_entry", f"{entry}: the environment variable {self.env} is not set or empty")
        self._secret = secret
        return self


class ServerConfig(_Section):
    """``[server]``: the gateway's socket, auth, limits and where it keeps state and logs."""

    host: str = Field(default="127.0.0.1", min_length=1)
    port: int = Field(default=8080, ge=0, le=65535)
    """0: pick a free port (``forge serve`` prints it)."""
    api_key: Annotated[SecretStr | None, BeforeValidator(_empty_is_none)] = None
    """Clients must send ``Authorization: Bearer <key>`` (or ``X-Api-Key``). Also ``FORGE_API_KEY``."""
    allow_unauthenticated: bool = False
    """Needed to bind a non-loopback host without an api_key: an explicit "yes, open to the network"."""
    cors_origins: list[str] = Field(default_factory=list)
    max_body_bytes: int = Field(default=16 * 1024 * 1024, gt=0)
    audio_max_bytes: int = Field(default=25 * 1024 * 1024, gt=0)
    """The largest audio file a whisper model takes on ``/v1/audio/transcriptions`` and
    ``/v1/audio/translations`` (OpenAI's limit is 25 MB); these uploads may exceed max_body_bytes."""
    log_format: Literal["text", "json"] = "text"
    state_dir: Path | None = None
    """Default: ``ForgeSettings.state_dir``; see :attr:`ForgeConfig.state_dir`."""
    log_dir: Path | None = None
    """Default: ``<state_dir>/logs``; see :attr:`ForgeConfig.log_dir`."""
    model_dirs: list[Path] = Field(default_factory=list)
    """Directories a model may be loaded from by path through the API (nothing else is)."""
    load_wait: float = Field(default=30.0, ge=0)
    """Seconds a request waits for a loading model; then 503 + Retry-After + load progress."""
    sse_keepalive: float = Field(default=5.0, ge=0)
    """Seconds between ``: keep-alive`` comments while a stream waits for its first token; 0: off."""
    keep_alive_streams: bool = False
    """Keep the client's connection open after a streamed answer (SSE). Off by default, as
    llama-server and its router do: a client that pools its connections (httpx, so the OpenAI and
    Anthropic SDKs) scans every idle one it holds for each request it sends, so a burst of N streams
    on kept connections took it O(N^2) work before the requests left (measured: 32 streams through
    one shared httpx client, ``bench_gateway.py --pin --shared-client [--keep-alive-streams]``: first
    token p50 +109 ms over direct kept, +30 ms closed). Closing costs a client a new loopback
    connection per stream (~1 ms at c=1 here).
    Non-streamed answers always keep the connection."""
    ollama_port: int | None = Field(default=None, ge=0, le=65535)
    """A second listener for Ollama clients, which look on 11434 (same routes, same auth)."""
    metrics_port: int | None = Field(default=None, ge=0, le=65535)
    """A listener that serves ``/metrics`` alone, without the API key (every other path: 404), for
    scrapers that cannot send one (an inference router's endpoint picker, a plain Prometheus)."""
    metrics_host: str = "127.0.0.1"
    """Where ``metrics_port`` listens: loopback unless set (a pod's scraper needs ``0.0.0.0``)."""
    metrics_public: bool = False
    """``/metrics`` on the main port without the key too (the Gateway API Inference Extension's
    endpoint picker scrapes the pool's target port and cannot send a key)."""
    context_dir: Path | None = None
    """Where ``keep_context`` models' saved KV-cache slots go. Default: ``<state_dir>/contexts``;
    see :attr:`ForgeConfig.context_dir`. The files hold users' prompts: forge keeps it 0700."""
    context_max_bytes: int = Field(default=16 * 2**30, ge=0)
    """Disk budget of all saved contexts together; past it the least recently used go first."""
    keys: list[KeyConfig] = Field(default_factory=list)
    """Client keys with their models and limits (``api_key``, when set, is one more admin key)."""
    activity: bool = True
    """Keep one record per request in ``<state_dir>/activity.db`` (``/api/activity``, ``/api/usage``)."""
    activity_keep_days: float = Field(default=30.0, gt=0)
    activity_max_rows: int = Field(default=100_000, gt=0)
    capture: bool = False
    """Keep each request's body and its response in the activity log (a model's ``capture`` wins)."""
    capture_max_bytes: int = Field(default=64 * 1024, gt=0)
    allow_remote_media: bool = False
    """Let requests name ``http(s)`` image URLs, which the model server then downloads itself from
    any address (loopback and private ones included). Off: such requests get a 400 (send base64)."""
    watch_config: bool = False
    """Reload when the config file or a ``conf.d/*.toml`` beside it changes (as SIGHUP does:
    unchanged models keep their children); a file that fails validation keeps the old config."""
    tls_cert: Path | None = None
    """A PEM certificate (chain): every listener serves HTTPS with it (``tls_key`` too, or neither)."""
    tls_key: Path | None = None
    """The certificate's private key, PEM, without a passphrase."""
    batch_max_bytes: int = Field(default=200 * 1024 * 1024, gt=0)
    """The largest file ``POST /v1/files`` takes (OpenAI's limit: 200 MB)."""
    batch_max_lines: int = Field(default=50_000, gt=0)
    """The most requests one batch's input file may hold (OpenAI's limit: 50 000)."""
    batch_concurrency: int = Field(default=4, ge=1)
    """Lines of the batches the service sends at once (each in the ``background`` class)."""

    @property
    def tls(self) -> bool:
        """The listeners speak HTTPS (``tls_cert`` and ``tls_key`` set: the validator makes it both)."""
        return self.tls_cert is not None

    @property
    def scheme(self) -> str:
        return "https" if self.tls else "http"

    @property
    def is_loopback(self) -> bool:
        return is_loopback(self.host)

    @model_validator(mode="after")
    def _one_entry_per_key(self) -> ServerConfig:
        names: set[str] = set()
        secrets = {self.api_key.get_secret_value(): "api_key"} if self.api_key is not None else {}
        for k in self.keys:
            entry = f"[[server.keys]] entry {k.name!r}"
            if k.name in names:
                raise custom(
                    "duplicate_key", f"{entry}: the name {k.name!r} is used twice: give each key its own name"
                )
            if k.secret in secrets:
                raise custom(
                    "duplicate_key",
                    f"{entry}: its key is the same as {secrets[k.secret]!r}'s: give each client its own key",
                )
            names.add(k.name)
            secrets[k.secret] = k.name
        return self

    @field_validator("tls_cert", "tls_key", mode="after")
    @classmethod
    def _expand(cls, path: Path | None) -> Path | None:
        return path.expanduser() if path is not None else None

    @model_validator(mode="after")
    def _tls_pair(self) -> ServerConfig:
        if (self.tls_cert is None) != (self.tls_key is None):
            has, lacks = ("tls_cert", "tls_key") if self.tls_key is None else ("tls_key", "tls_cert")
            raise custom(
                lacks, f"{has} is set but {lacks} is not: set both (the certificate and its key) or neither"
            )
        if self.tls_cert is not None and self.tls_key is not None:
            problem = tls_pair_problem(self.tls_cert, self.tls_key)
            if problem is not None:
                raise custom(*problem)
        return self

    @model_validator(mode="after")
    def _refuse_open_bind(self) -> ServerConfig:
        # Checked here, not in the gateway, so that no path (file, env, a CLI override through
        # ForgeConfig.with_server) can start an open, unauthenticated server by accident.
        if not self.is_loopback and self.api_key is None and not self.keys and not self.allow_unauthenticated:
            raise custom(
                "insecure_bind",
                f"host {self.host!r} is reachable from the network, and there is no api_key",
            )
        return self
