"""The backends table: one entry per kind of child server a model can have (``[models.NAME]
backend``). The supervisor plans a launch, the model's watchers choose what to watch, and the
gateway decides which routes a model answers, by reading its entry; nothing else asks
``backend == …``.

A new kind of server is one entry here, its launch pipeline (a ``plan`` function taking the
narrow :class:`~._host.PlacementHost`), its :class:`~..process.ServerProgram` in ``process/`` and its
keys in ``config/_backends.py`` (a test keeps the names of the two tables the same).

Every ``plan`` places its model the same way: under the placement lock, through
:func:`~._evicting.place_here` and the one pure :func:`~._placement.place` (idle models evicted
for room, the residency rules, the refusals). A GGUF model sends a ``PlacementRequest``; a model of
a size it is given (whisper, a command) a ``SizedRequest`` through :func:`~._sized_plan.plan_sized`,
so a new backend of that shape only resolves what it runs. tests/supervisor/test_residency_matrix.py
runs every rule for every entry of this table.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from ..._errors import UsageError
from ...config import ModelConfig
from ...config._backends import BACKEND_NAMES, BackendName
from ..launch._launch import LaunchPlan
from ._command import plan_command
from ._host import HostedModel, PlacementHost
from ._llama_plan import plan_llama
from ._whisper import plan_whisper

__all__ = ["AUDIO_ROUTES", "BACKENDS", "Backend", "backend_of"]

PlanFn = Callable[[PlacementHost, HostedModel], Awaitable[LaunchPlan]]


async def _never_planned(_host: PlacementHost, m: HostedModel) -> LaunchPlan:
    raise UsageError(f"model {m.name!r} is a peer's: it has no process to start here")


#: whisper-server's routes behind the gateway.
AUDIO_ROUTES = frozenset({"/v1/audio/transcriptions", "/v1/audio/translations", "/inference"})


@dataclass(frozen=True)
class Backend:
    """What one kind of child server is to the supervisor and the gateway."""

    name: BackendName
    #: How a refusal names a model of this kind: "a whisper (speech to text) model".
    what: str
    #: The kind as the status page names it: the backend, then what such a model is.
    label: str
    plan: PlanFn
    #: It has llama-server's ``/slots``: the progress (stall) watchdog and slot saves can run.
    has_slots: bool
    #: The gateway routes it answers (None: every model route the gateway has).
    routes_of: Callable[[ModelConfig], frozenset[str] | None]
    #: ``path`` names a model file forge reads (a GGUF, a whisper model); a command's is whatever
    #: its ``${MODEL}`` stands for (a hub id, a directory), not judged.
    reads_path: bool = True
    #: Its requests are audio forms the gateway translates to whisper-server's ``/inference``,
    #: answered whole in the asked ``response_format`` (no relay).
    transcribes: bool = False
    #: Its server decides which images and audio it takes (forge cannot know a command's): the
    #: gateway checks only the URLs, not for a projector (``mmproj``).
    judges_media: bool = False
    #: Served by another server (``[peers.*]``): no process here, never planned or placed.
    remote: bool = False

    def serves(self, config: ModelConfig, path: str) -> bool:
        routes = self.routes_of(config)
        return routes is None or path in routes


BACKENDS: Mapping[BackendName, Backend] = {
    "llama": Backend(
        "llama", "a llama-server model", "llama · language model", plan_llama, True, lambda _c: None
    ),
    "whisper": Backend(
        "whisper",
        "a whisper (speech to text) model",
        "whisper · speech to text",
        plan_whisper,
        False,
        lambda _c: AUDIO_ROUTES,
        transcribes=True,
    ),
    "command": Backend(
        "command",
        "a command (a server forge runs as configured)",
        "command · OpenAI-compatible server",
        plan_command,
        False,
        lambda c: frozenset(c.command_routes),
        reads_path=False,
        judges_media=True,
    ),
    "peer": Backend(
        "peer",
        "a peer's model (served by another server)",
        "peer · another server",
        _never_planned,
        False,
        lambda c: frozenset(c.command_routes),
        reads_path=False,
        judges_media=True,
        remote=True,
    ),
}
assert tuple(BACKENDS) == BACKEND_NAMES, "config/_backends.py and this table name the same backends"


def backend_of(config: ModelConfig) -> Backend:
    return BACKENDS[config.backend]
