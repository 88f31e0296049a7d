"""Supervision: in-process loads, placement, and the multi-model supervisor behind `forge serve`."""

from ._events import Event, EventBus
from ._local import LoadOptions, LocalModel, aload_model, load_model, plan_local_load
from ._managed import ManagedModel, ModelState, SupervisionPolicy
from ._supervisor import Supervisor

__all__ = [
    "Event",
    "EventBus",
    "LoadOptions",
    "LocalModel",
    "ManagedModel",
    "ModelState",
    "SupervisionPolicy",
    "Supervisor",
    "aload_model",
    "load_model",
    "plan_local_load",
]
