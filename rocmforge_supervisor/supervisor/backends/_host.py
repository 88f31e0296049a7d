"""What a launch pipeline and the pressure monitor may use of the supervisor: a narrow protocol
instead of the :class:`~._supervisor.Supervisor` with its private members (which made two import
circles). The supervisor satisfies it; a test's stand-in may too.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import anyio

from ...config import ForgeSettings, ModelConfig, SupervisorConfig, WorkerConfig
from ...hardware import Inventory
from .._events import EventBus
from ..launch._launch import LaunchPlan
from ..placement._device_context import DeviceContexts
from ..placement._placement_types import LoadedModel
from ..placement._residency import GroupRule

if TYPE_CHECKING:
    from ..contexts._keep_context import ContextKeeper

__all__ = ["HostedModel", "PlacementHost"]


class HostedModel(Protocol):
    """What planning a start reads of a model, its own or another the supervisor holds: a narrow
    reference (``ManagedModel`` satisfies it), so no plan function imports the model's lifecycle,
    not even for its annotations."""

    @property
    def name(self) -> str: ...

    @property
    def config(self) -> ModelConfig: ...

    @property
    def warming(self) -> bool:
        """A start without a request (the warm default): it never evicts."""
        ...

    @property
    def running(self) -> bool: ...

    @property
    def plan(self) -> LaunchPlan | None: ...

    def as_loaded(self) -> LoadedModel | None:
        """What it holds now, as placement counts it (None: nothing)."""
        ...

    async def unload(self, reason: str = "unload", *, save: bool = True) -> None: ...


class PlacementHost(Protocol):
    """The supervisor's side of placement: its settings and policy, the models, the lock every
    placement decision is taken under, the inventory, the events and the children's record."""

    settings: ForgeSettings
    log_dir: Path
    state_dir: Path
    events: EventBus
    placement_lock: anyio.Lock
    device_contexts: DeviceContexts
    #: The llama-server every llama child runs, and the flags its self-test asks for.
    binary: Path | None
    binary_args: tuple[str, ...]

    @property
    def policy(self) -> SupervisorConfig: ...

    @property
    def models(self) -> Mapping[str, HostedModel]: ...

    @property
    def workers(self) -> Sequence[WorkerConfig]: ...

    @property
    def groups(self) -> Mapping[str, GroupRule]:
        """``[groups.*]``: the residency rules of the configured groups."""
        ...

    async def refresh_inventory(self) -> Inventory: ...

    def record_children(self) -> None: ...

    def log_forwarder(self, name: str) -> Callable[[str], None]: ...

    def keeper(self, name: str) -> ContextKeeper: ...
