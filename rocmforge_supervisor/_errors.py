"""The one exception hierarchy of rocmforge-supervisor.

Every error the package raises on purpose derives from :class:`ForgeError`. Errors from outside
(OSError, httpx, subprocess, gguf) are translated where they cross into this package, with
``raise X(...) from exc``, so callers catch one family and the CLI can print one line for each.

Each error carries a ``hint`` (what to do about it) and an ``exit_code`` for the CLI: 2 for a usage
error (the input was wrong), 1 for a runtime failure (the input was fine, the world was not).

::

    ForgeError
    ├── UsageError                 bad input from the caller (exit 2)
    │   ├── ConfigError            a config key or setting is invalid
    │   ├── ModelNotFound          no such file / short name / hub reference
    │   ├── Unauthorized           the HTTP edge: no or a wrong API key (401)
    │   ├── Forbidden              the HTTP edge: a cross-origin write from a web page (403)
    │   │   └── KeyForbidden       an API key used beyond its scope: a model, an admin route (403)
    │   ├── RateLimited            an API key over its requests_per_minute or tokens_per_day (429)
    │   ├── InvalidRequest         the HTTP edge: a request body field is wrong (400, names it)
    │   ├── PayloadTooLarge        the HTTP edge: a request body over the limit (413)
    │   ├── UnsupportedMediaType   the HTTP edge: a JSON route sent a body that is not JSON (415)
    │   ├── InvalidArgument        the Python API: an argument is wrong (also a ValueError)
    │   └── ModelClosed            the Python API: a TextModel used after close() (also a RuntimeError)
    ├── InvalidModelFile           not a GGUF, truncated, unsupported version (exit 2)
    ├── BuildError                 llama-server could not be built
    │   ├── SourceError            llama.cpp sources missing, unverifiable, or the wrong hash
    │   └── ToolchainMissing       cmake / compiler / ROCm / CUDA not there
    ├── BinaryNotFound             no llama-server to run
    │   └── SelfTestFailed         it is there, but could not serve one completion on this machine
    ├── PlacementError             the model fits on no device (names need and free memory)
    │   ├── ResidencyConflict      a residency rule forbids the load: pinned, swap = never, a group (409)
    │   └── ResidencyBusy          its group's members are busy: the load waits
    ├── HubError                   Hugging Face resolution or download failed
    ├── InstanceError              a llama-server child failed
    │   ├── StartFailed            it never became ready (``reason`` says why)
    │   └── ModelCrashed           it died (or was killed) while serving
    ├── RequestError               a request to a running server failed
    │   ├── ServerUnavailable      cannot connect, or 503
    │   ├── RequestRejected        4xx: the request itself was refused
    │   │   └── ContextExceeded    the prompt does not fit the context
    │   ├── ServerError            5xx or an error event inside a stream
    │   └── StreamError            the stream ended early or was malformed
    └── ServiceError               talking to or running ``forge serve``
        ├── QueueFull              too many requests waiting for one model
        ├── ForcedExit             a second SIGTERM/SIGINT cut the drain short (exit 128 + signal)
        ├── ModelFailed            the model's breaker is open (a missing file, a crash loop …)
        └── ModelRetired           a reload replaced or removed the model: look it up again
"""

from __future__ import annotations

import signal

__all__ = [
    "BinaryNotFound",
    "BuildError",
    "ConfigError",
    "ContextExceeded",
    "Forbidden",
    "ForcedExit",
    "ForgeError",
    "HubError",
    "InstanceError",
    "InvalidArgument",
    "InvalidModelFile",
    "InvalidRequest",
    "KeyForbidden",
    "ModelClosed",
    "ModelCrashed",
    "ModelFailed",
    "ModelLoading",
    "ModelNotFound",
    "ModelRetired",
    "PayloadTooLarge",
    "PlacementError",
    "QueueFull",
    "RateLimited",
    "RequestError",
    "RequestRejected",
    "ResidencyBusy",
    "ResidencyConflict",
    "SelfTestFailed",
    "ServerError",
    "ServerUnavailable",
    "ServiceError",
    "SourceError",
    "StartFailed",
    "StreamError",
    "ToolchainMissing",
    "Unauthorized",
    "UnsupportedMediaType",
    "UsageError",
]


class ForgeError(Exception):
    """Base of every error rocmforge-supervisor raises on purpose.

    ``message`` names the problem; ``hint`` names the fix. ``str()`` gives both on one line, which
    is what the CLI prints.
    """

    exit_code = 1

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        if self.hint:
            return f"{self.message} — {self.hint}"
        return self.message


class UsageError(ForgeError):
    """The caller's input was wrong; nothing was started."""

    exit_code = 2


class ConfigError(UsageError):
    """A configuration key or setting is invalid. ``key`` names it when known."""

    def __init__(self, message: str, *, key: str | None = None, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.key = key


class ModelNotFound(UsageError):
    """No model at that path, short name or hub reference."""


class Unauthorized(UsageError):
    """The HTTP edge: the request carries no API key, or the wrong one."""


class Forbidden(UsageError):
    """The HTTP edge: a web page (another Origin) tried to drive the local service."""


class KeyForbidden(Forbidden):
    """The HTTP edge: a valid API key used beyond its scope. ``code`` says which scope
    (``model_not_allowed``, ``admin_required``); the message names the key's *name*, never the key."""

    def __init__(self, message: str, *, code: str, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.code = code


class RateLimited(UsageError):
    """The HTTP edge: an API key over one of its limits; it may retry after ``retry_after`` s."""

    def __init__(self, message: str, *, retry_after: float, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.retry_after = retry_after


class InvalidRequest(UsageError):
    """The HTTP edge: the request body is not what the route takes; ``param`` names the field."""

    def __init__(self, message: str, *, param: str | None = None, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.param = param


class PayloadTooLarge(UsageError):
    """The HTTP edge: the request body is over the limit (declared or counted while read);
    ``param`` names the form field when one part is what is too big (an audio upload's ``file``)."""

    def __init__(self, message: str, *, param: str | None = None, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.param = param


class UnsupportedMediaType(UsageError):
    """The HTTP edge: a JSON route got another ``Content-Type`` (an HTML form's, say)."""


class InvalidArgument(UsageError, ValueError):
    """An argument of the Python API is wrong (a URL, a length). Also a ``ValueError``, as Python
    code that checks arguments expects."""


class ModelClosed(UsageError, RuntimeError):
    """A ``TextModel`` used after ``close()``. Also a ``RuntimeError``: using a closed object is
    one in Python's own terms (a closed file's ``ValueError`` aside)."""


class InvalidModelFile(ForgeError):
    """The file is not a loadable GGUF (bad magic, unsupported version, truncated)."""

    exit_code = 2


class BuildError(ForgeError):
    """llama-server could not be built. ``log_path`` and ``log_tail`` say why, when a build ran."""

    def __init__(
        self,
        message: str,
        *,
        hint: str | None = None,
        log_path: str | None = None,
        log_tail: list[str] | None = None,
    ) -> None:
        super().__init__(message, hint=hint)
        self.log_path = log_path
        self.log_tail = log_tail or []


class SourceError(BuildError):
    """The llama.cpp sources are missing, unverifiable, or do not match the pinned hash."""


class ToolchainMissing(BuildError):
    """A tool the build needs (cmake, a C++ compiler, ROCm's hipconfig/hipBLAS, nvcc) is missing."""

    exit_code = 1


class BinaryNotFound(ForgeError):
    """No usable llama-server binary was found."""


class SelfTestFailed(BinaryNotFound):
    """A llama-server that runs ``--version`` but could not serve one completion on this machine
    (a crash on the first token, an instruction this CPU lacks): no model is handed to it."""


class PlacementError(ForgeError):
    """The model does not fit on any allowed device, even after evicting idle models."""


class ResidencyConflict(PlacementError):
    """A load the residency rules forbid: it would need a pinned or never-swap model gone, or a
    group's loaded members all stay (409 at the edge, at once: waiting cannot change it)."""

    def __init__(self, message: str, *, rule: str, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        #: The rule that decided: ``pinned``, ``swap = "never"``, ``group 'chat' has max_loaded = 1``.
        self.rule = rule

    def again(self) -> ResidencyConflict:
        """A fresh copy for another waiter (one exception object raised in two tasks would
        carry both tracebacks)."""
        return ResidencyConflict(self.message, rule=self.rule, hint=self.hint)


class ResidencyBusy(PlacementError):
    """A load that waits: its group's loaded members are busy (the start re-plans when one is idle)."""

    def __init__(self, message: str, *, rule: str, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.rule = rule


class HubError(ForgeError):
    """A Hugging Face reference could not be resolved or downloaded."""


class InstanceError(ForgeError):
    """A llama-server child failed. Carries what we know of its end."""

    def __init__(
        self,
        message: str,
        *,
        hint: str | None = None,
        returncode: int | None = None,
        reason: str = "crashed",
        stderr_tail: list[str] | None = None,
        log_path: str | None = None,
    ) -> None:
        super().__init__(message, hint=hint)
        #: The child's return code (negative: killed by that signal), None if still unknown.
        self.returncode = returncode
        #: One of: file_not_found, invalid_model, unsupported, oom, bind, timeout, crashed, cancelled.
        self.reason = reason
        self.stderr_tail = stderr_tail or []
        self.log_path = log_path


class StartFailed(InstanceError):
    """The child never became ready."""


class ModelCrashed(InstanceError):
    """The child died while it was serving (a stream in flight gets this)."""


class RequestError(ForgeError):
    """A request to a running llama-server (or a forge service) failed."""

    def __init__(
        self,
        message: str,
        *,
        hint: str | None = None,
        status_code: int | None = None,
        error_type: str | None = None,
    ) -> None:
        super().__init__(message, hint=hint)
        self.status_code = status_code
        self.error_type = error_type


class ServerUnavailable(RequestError):
    """The server cannot be reached, or answered 503."""


class RequestRejected(RequestError):
    """The server refused the request (4xx): fix the request, not the server."""


class ContextExceeded(RequestRejected):
    """The prompt (plus what is asked for) does not fit the context window."""

    def __init__(
        self,
        message: str,
        *,
        hint: str | None = None,
        status_code: int | None = 400,
        n_prompt_tokens: int | None = None,
        n_ctx: int | None = None,
    ) -> None:
        super().__init__(
            message,
            hint=hint or "shorten the prompt or raise --ctx-size",
            status_code=status_code,
            error_type="exceed_context_size_error",
        )
        self.n_prompt_tokens = n_prompt_tokens
        self.n_ctx = n_ctx


class ServerError(RequestError):
    """The server failed while handling the request (5xx, or an error event inside a stream)."""


class StreamError(RequestError):
    """The stream ended before its end marker, or carried something that is not SSE/JSON."""


class ServiceError(ForgeError):
    """Running, or talking to, the ``forge serve`` service failed."""


class QueueFull(ServiceError):
    """Too many requests are waiting for one model; retry after ``retry_after`` seconds."""

    def __init__(self, message: str, *, retry_after: float = 1.0, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.retry_after = retry_after


class ModelFailed(ServiceError):
    """The model failed for good: its breaker is open until ``forge load NAME`` or a reload, so a
    retry cannot succeed. ``kind`` says why (file_not_found, invalid, placement, crash_loop, …)."""

    def __init__(self, message: str, *, kind: str | None = None, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.kind = kind


class ModelRetired(ServiceError):
    """The model object was replaced or removed by a reload: look the name up again."""


class ForcedExit(ServiceError):
    """``forge serve`` was told twice to stop: the drain was cut short. The exit status is the
    shell's "ended by signal N" (128 + N), so a service manager sees why."""

    def __init__(self, signum: int) -> None:
        name = signal.Signals(signum).name
        super().__init__(
            f"forced exit: a second {name} during the drain cut requests in flight short",
            hint="send one SIGTERM (or Ctrl-C once) to let requests finish",
        )
        self.signum = signum
        self.exit_code = 128 + signum


class ModelLoading(ServiceError):
    """The model is still loading after the request's ``load_wait``: retry after ``retry_after`` s.

    ``loading`` is what the client is told about the load: ``{state, progress, eta_seconds}``
    (LocalAI's protocol; progress and eta are None until a previous load gives a measured duration).
    """

    def __init__(
        self, message: str, *, retry_after: float, loading: dict[str, object], hint: str | None = None
    ) -> None:
        super().__init__(message, hint=hint)
        self.retry_after = retry_after
        self.loading = loading
