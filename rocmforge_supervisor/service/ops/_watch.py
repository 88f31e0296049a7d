"""``[server] watch_config`` / ``forge serve --watch``: the config follows its files.

The config file and ``conf.d/*.toml`` beside it are polled (every :data:`POLL` s): each file's
mtime, size and a hash of its content, so that an editor that writes a new file and renames it
into place, a Kubernetes ConfigMap's symlink swap (``..data`` → a new directory) and a file added
to or removed from ``conf.d`` are all seen, and a ``touch`` that changes nothing is not. After a
change, the files must be still for :data:`QUIET` s (an editor's several writes, ``kubectl``'s
swap) before the reload runs — the same reload as SIGHUP, which keeps every unchanged child.

A polled look instead of inotify: inotify misses the ConfigMap swap (the watched inode is not
the one that changes) and network filesystems, and a few ``stat`` calls every 2 s cost nothing.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio

from ..._errors import ForgeError
from ...config import config_files
from ...supervisor import EventBus, EventKind

__all__ = ["POLL", "QUIET", "Snapshot", "snapshot", "watch_config"]

log = logging.getLogger("rocmforge.service")

#: Seconds between looks at the files.
POLL = 2.0
#: Seconds the files must stay unchanged after a change before the reload.
QUIET = 1.0
#: Seconds between looks while a change settles (so the reload follows the quiet period closely).
_SETTLING = 0.2

Snapshot = dict[str, tuple[int, int, str]]


def snapshot(source: Path) -> Snapshot:
    """Each config file's (mtime, size, content hash), by path; a file that vanished between the
    listing and the read is left out (the next look sees the directory as it is then)."""
    out: Snapshot = {}
    for path in config_files(source if source.exists() else None) or [source]:
        try:
            st = path.stat()
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
        except OSError:
            continue
        out[str(path)] = (st.st_mtime_ns, st.st_size, digest)
    return out


async def watch_config(
    source: Path,
    reload: Callable[[], Awaitable[object]],
    events: EventBus,
    enabled: Callable[[], bool],
    *,
    poll: float = POLL,
    quiet: float = QUIET,
) -> None:
    """Until cancelled: reload when the files changed and then stayed still for ``quiet`` s.
    ``enabled`` is asked at every look (``watch_config`` may be turned on or off by a reload)."""
    applied = await anyio.to_thread.run_sync(snapshot, source)
    while True:
        await anyio.sleep(poll)
        if not enabled():
            applied = await anyio.to_thread.run_sync(snapshot, source)
            continue
        now = await anyio.to_thread.run_sync(snapshot, source)
        if now == applied:
            continue
        # Changed: wait until it has been still for `quiet` seconds.
        still_since = anyio.current_time()
        while anyio.current_time() - still_since < quiet:
            await anyio.sleep(_SETTLING)
            later = await anyio.to_thread.run_sync(snapshot, source)
            if later != now:
                now, still_since = later, anyio.current_time()
        changed = sorted(set(now) ^ set(applied) | {p for p in now if applied.get(p) != now[p]})
        applied = now
        log.info("config files changed: reloading")
        try:
            await reload()
        except ForgeError as exc:
            # The running config stays; the event says why (the reload logged it too).
            events.publish("*", EventKind.CONFIG_REJECTED, error=str(exc), files=changed)
        except Exception as exc:  # a bug in a reload must not end the watch
            log.exception("reload after a config change failed; the running config stays")
            events.publish("*", EventKind.CONFIG_REJECTED, error=repr(exc), files=changed)
