"""The backends table: one entry per kind of model a ``[models.NAME]`` (or ``[peers.NAME]``) has,
each made by its own folder — ``llama/``, ``whisper/``, ``command/``, ``peer/`` hold the whole
backend on the supervisor's side (how it is planned and placed; a server forge runs, its program
and child kind). The supervisor plans a launch, the model's watchers choose what to watch, and the
gateway decides which routes a model answers, by reading its entry; nothing else asks
``backend == …``.

A new backend is a folder here that makes a :class:`~._entry.Backend` and one line below; the
config's side (its name and which keys mean something to it) is ``config/_backends.py`` (a test
keeps the two tables' names the same).

Every ``plan`` places its model the same way: under the placement lock, through
:func:`~._evicting.place_here` and the one pure :func:`~..placement._placement.place` (idle models
evicted for room, the residency rules, the refusals). A GGUF model sends a ``PlacementRequest``; a
model of a size it is given (whisper, a command) a ``SizedRequest`` through
:func:`~._sized_plan.plan_sized`, so a new backend of that shape only resolves what it runs.
tests/supervisor/test_residency_matrix.py runs every rule for every entry of this table.
"""

from __future__ import annotations

from collections.abc import Mapping

from ...config import ModelConfig
from ...config._backends import BACKEND_NAMES, BackendName
from . import command, llama, peer, whisper
from ._entry import Backend
from .whisper import AUDIO_ROUTES

__all__ = ["AUDIO_ROUTES", "BACKENDS", "Backend", "backend_of"]

BACKENDS: Mapping[BackendName, Backend] = {
    b.name: b
    for b in (
        llama.BACKEND,
        whisper.BACKEND,
        command.BACKEND,
        peer.BACKEND,
    )
}
assert tuple(BACKENDS) == BACKEND_NAMES, "config/_backends.py and this table name the same backends"


def backend_of(config: ModelConfig) -> Backend:
    return BACKENDS[config.backend]
