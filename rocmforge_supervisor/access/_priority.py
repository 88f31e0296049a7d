"""A request's admission class: its key's ``priority``, lowered (never raised) by ``X-Priority``.

An admin key may also raise it: whoever holds an admin key can change every key's setting anyway.
The classes and their order are the admission queue's (``supervisor._admission``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from .._errors import InvalidRequest, KeyForbidden

if TYPE_CHECKING:
    from ._keys import Key

__all__ = ["PRIORITY_CLASSES", "PRIORITY_HEADER", "PriorityClass", "request_class"]

PriorityClass = Literal["interactive", "batch", "background"]

#: The classes, highest first.
PRIORITY_CLASSES: tuple[PriorityClass, ...] = ("interactive", "batch", "background")

#: The request header that asks for a class.
PRIORITY_HEADER = "X-Priority"


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
