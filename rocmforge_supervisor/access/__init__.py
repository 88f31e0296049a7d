"""Who may do what: the API keys, the models each may use, admin rights, and per-key limits.

The gateway asks these at its one auth place (the request middleware) and where a request's
model becomes known; nothing here knows HTTP. A key is found by constant-time comparison with
every configured key; from then on only its *name* travels (logs, errors, the activity log).
"""

from ._keys import (
    ADMIN_KEY_NAME,
    PRIORITY_CLASSES,
    PRIORITY_HEADER,
    Key,
    KeyRing,
    PriorityClass,
    request_class,
)
from ._limits import Limiter

__all__ = [
    "ADMIN_KEY_NAME",
    "PRIORITY_CLASSES",
    "PRIORITY_HEADER",
    "Key",
    "KeyRing",
    "Limiter",
    "PriorityClass",
    "request_class",
]
