"""The configured keys (``[[server.keys]]`` and ``server.api_key``) and what each may use, and a
request's admission class: its key's ``priority``, lowered (never raised) by ``X-Priority``.

An admin key may also raise it: whoever holds an admin key can change every key's setting anyway.
The classes and their order are the admission queue's (``supervisor._admission``). One module:
a key's class and the rule that reads it are one thing (they were two modules, importing each
other).
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Literal

from .._errors import InvalidRequest, KeyForbidden
from ..config import ServerConfig

__all__ = [
    "ADMIN_KEY_NAME",
    "PRIORITY_CLASSES",
    "PRIORITY_HEADER",
    "Key",
    "KeyRing",
    "PriorityClass",
    "request_class",
]

PriorityClass = Literal["interactive", "batch", "background"]

#: The classes, highest first.
PRIORITY_CLASSES: tuple[PriorityClass, ...] = ("interactive", "batch", "background")

#: The request header that asks for a class.
PRIORITY_HEADER = "X-Priority"


#: The name ``server.api_key`` goes by in logs, usage and errors.
ADMIN_KEY_NAME = "api_key"


@dataclass(frozen=True)
class Key:
    """One client key: its name, the model globs it may use, admin or not, and its limits."""

    name: str
    secret: bytes
    models: tuple[str, ...] = ("*",)
    admin: bool = False
    requests_per_minute: int | None = None
    tokens_per_day: int | None = None
    #: Its requests' admission class (``interactive``, ``batch``, ``background``).
    priority: PriorityClass = "interactive"

    def __repr__(self) -> str:  # never the secret, even in a traceback
        return f"Key(name={self.name!r}, admin={self.admin})"

    def may_use(self, model: str) -> bool:
        """A name its globs match; a variant or adapter ``X:Y`` also when it may use ``X`` (the
        same weights and child, and ``X``'s requests can send the same fields). A key that names
        only ``X:json`` may not use ``X`` itself."""
        if any(fnmatchcase(model, pattern) for pattern in self.models):
            return True
        parent, colon, _ = model.partition(":")
        return bool(colon) and any(fnmatchcase(parent, pattern) for pattern in self.models)

    def check_model(self, model: str) -> None:
        """:class:`KeyForbidden` naming the key's name and the model when it may not use it."""
        if not self.may_use(model):
            raise KeyForbidden(
                f"the API key {self.name!r} may not use model {model!r}",
                code="model_not_allowed",
                hint=f"use a model it allows ({', '.join(self.models)}), or add {model!r} to its models in [[server.keys]]",
            )

    def check_admin(self, what: str) -> None:
        if not self.admin:
            raise KeyForbidden(
                f"the API key {self.name!r} may not {what}: it needs an admin key",
                code="admin_required",
                hint="use server.api_key or a [[server.keys]] entry with admin = true",
            )


class KeyRing:
    """Every key the service accepts; empty: the service is open (no auth configured)."""

    def __init__(self, keys: Iterable[Key]) -> None:
        self.keys = tuple(keys)

    @classmethod
    def from_config(cls, server: ServerConfig) -> KeyRing:
        keys = [
            Key(
                k.name,
                k.secret.encode(),
                tuple(k.models),
                k.admin,
                k.requests_per_minute,
                k.tokens_per_day,
                k.priority,
            )
            for k in server.keys
        ]
        if server.api_key is not None:
            keys.insert(0, Key(ADMIN_KEY_NAME, server.api_key.get_secret_value().encode(), admin=True))
        return cls(keys)

    def __bool__(self) -> bool:
        return bool(self.keys)

    def identify(self, token: bytes) -> Key | None:
        """The key ``token`` is, or None. Compared with *every* key in constant time, so neither
        the answer's timing nor which key matched tells anything about the others."""
        found: Key | None = None
        for key in self.keys:
            if hmac.compare_digest(token, key.secret) and found is None:
                found = key
        return found


def request_class(key: Key | None, asked: str | None) -> PriorityClass:
    """The class a request of ``key`` (None: a service without keys) is admitted in, given the
    ``X-Priority`` header's value ``asked`` (None: absent). Without keys anyone may ask any class.
    :class:`InvalidRequest` for an unknown class, :class:`KeyForbidden` for a raise a key may not do."""
    own: PriorityClass = key.priority if key is not None else "interactive"
    if asked is None or not asked.strip():
        return own
    wanted = asked.strip().lower()
    if wanted not in PRIORITY_CLASSES:
        raise InvalidRequest(
            f"{PRIORITY_HEADER}: {asked!r} is not a priority class",
            param=PRIORITY_HEADER,
            hint=f"send one of {', '.join(PRIORITY_CLASSES)} (or leave the header out)",
        )
    cls: PriorityClass = wanted
    if key is None or key.admin or PRIORITY_CLASSES.index(cls) >= PRIORITY_CLASSES.index(own):
        return cls
    raise KeyForbidden(
        f"the API key {key.name!r} may not raise its requests to {cls!r}: its priority is {own!r}",
        code="priority_not_allowed",
        hint=f"send {PRIORITY_HEADER}: {own} or lower, or set priority in its [[server.keys]] entry",
    )
