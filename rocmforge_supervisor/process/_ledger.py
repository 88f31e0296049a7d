"""The children ledger: which llama-servers a supervisor runs, on disk, for the next run's sweep.

No orphans, third layer (after the parent-death signal and a clean, shielded stop): a supervisor
that died hard (SIGKILL, power cut of the unit) leaves ``children.json`` behind; the next one reads
it at start and stops each recorded child that still runs — checked by pid, start time and command
line, so a reused pid is never touched. This is the only place outside :class:`ModelServer` that
signals a process, and it lives in ``process/`` for that reason.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable
from pathlib import Path

import psutil

from .._files import write_text_atomic
from ._instance import ModelServer

__all__ = ["ChildLedger"]

log = logging.getLogger("rocmforge.process")

#: How long a stale child gets between SIGTERM and SIGKILL.
_STALE_GRACE = 5.0


class ChildLedger:
    """``<state_dir>/children.json``: the live children of this supervisor, by model name."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir

    @property
    def path(self) -> Path:
        return self.state_dir / "children.json"

    def record(self, children: Iterable[tuple[str, ModelServer]]) -> None:
        """Replace this supervisor's records with its children that are alive now (written
        atomically). Records of another live ``forge serve`` stay: one instance never rewrites
        another's (the state-dir lock makes two rare; this keeps the ledger right if it happens)."""
        records = self._foreign()
        for model, server in children:
            if not server.alive or server.pid is None:
                continue
            try:
                created = psutil.Process(server.pid).create_time()
            except psutil.Error:
                continue
            records.append(
                {"pid": server.pid, "create_time": created, "model": model, "supervisor": os.getpid()}
            )
        self._write(records)

    def _write(self, records: list[dict[str, object]]) -> None:
        try:
            self.state_dir.mkdir(parents=True, exist_ok=True)
            write_text_atomic(self.path, json.dumps(records))
        except OSError as exc:
            log.warning("could not record children in %s: %s", self.path, exc)

    def reap_stale(self) -> list[int]:
        """Stop llama-server children that a previous run recorded and that still run; their pids."""
        procs = [p for p in map(_stale, self._read()) if p is not None]
        for p in procs:
            p.terminate()
        _, alive = psutil.wait_procs(procs, timeout=_STALE_GRACE)
        for p in alive:
            p.kill()
        foreign = self._foreign()
        if foreign:
            self._write(foreign)
        else:
            self.path.unlink(missing_ok=True)
        return [p.pid for p in procs]

    def _read(self) -> list[object]:
        try:
            records = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return []
        return records if isinstance(records, list) else []

    def _foreign(self) -> list[dict[str, object]]:
        """The records of another supervisor that is still running."""
        out = []
        for r in self._read():
            if not isinstance(r, dict):
                continue
            try:
                owner = int(r.get("supervisor", 0))
            except (TypeError, ValueError):
                continue
            if owner and owner != os.getpid() and psutil.pid_exists(owner) and _is_forge(owner):
                out.append(r)
        return out


def _stale(record: object) -> psutil.Process | None:
    """The process of a ledger record, when it is still that llama-server and nobody owns it."""
    if not isinstance(record, dict):
        return None
    try:
        p = psutil.Process(int(record["pid"]))
        if abs(p.create_time() - float(record["create_time"])) > 0.5:
            return None  # the pid was reused by something else
        if not any("llama-server" in part for part in p.cmdline()[:4]):
            return None
        owner = int(record.get("supervisor", 0))
        if owner == os.getpid() or (owner and psutil.pid_exists(owner) and _is_forge(owner)):
            return None  # ours, or another live forge serve's on the same state dir
    except (psutil.Error, KeyError, ValueError, TypeError):
        return None
    log.warning(
        "stopping stale llama-server pid %d (model %s) left by a previous run", p.pid, record.get("model")
    )
    return p


def _is_forge(pid: int) -> bool:
    try:
        return any(
            "rocmforge" in part or "forge" in Path(part).name for part in psutil.Process(pid).cmdline()[:4]
        )
    except psutil.Error:
        return False
