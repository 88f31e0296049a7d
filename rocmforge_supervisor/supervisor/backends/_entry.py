"""What one backend is to the supervisor and the gateway: a :class:`Backend`, made by its folder
(``llama/``, ``whisper/``, ``command/``, ``peer/``) and listed once in :mod:`._backends`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from pydantic import BaseModel

from ...config import ModelConfig
from ...config._backends import BackendName
from ..launch._launch import LaunchPlan
from ._host import HostedModel, PlacementHost

__all__ = ["Backend", "PlanFn"]

#: How a backend plans a start: the narrow host and the model in, the launch plan out.
PlanFn = Callable[[PlacementHost, HostedModel], Awaitable[LaunchPlan]]


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
    #: ``path`` is a GGUF (its header can be checked before any start: ``--check-config``).
    gguf: bool = False
    #: Its requests are audio forms the gateway translates to whisper-server's ``/inference``,
    #: answered whole in the asked ``response_format`` (no relay).
    transcribes: bool = False
    #: Its server decides which images and audio it takes (forge cannot know a command's): the
    #: gateway checks only the URLs, not for a projector (``mmproj``).
    judges_media: bool = False
    #: Served by another server (``[peers.*]``): no process here, never planned or placed.
    remote: bool = False
    #: The ``[models.NAME]`` keys only this backend reads: a class ``ModelConfig`` is made of
    #: (``config/_llama_keys.LlamaKeys``…), whose keys the config refuses on any other backend.
    keys: type[BaseModel] | None = None

    def serves(self, config: ModelConfig, path: str) -> bool:
        routes = self.routes_of(config)
        return routes is None or path in routes
