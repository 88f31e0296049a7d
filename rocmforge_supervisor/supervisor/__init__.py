"""Supervision: in-process loads, placement, and the multi-model supervisor behind `forge serve`."""

from ._events import Event, EventBus, EventKind
from ._launch import LaunchPlan, ModelSpec
from ._local import LoadOptions, LocalModel, aload_model, load_model, plan_local_load
from ._managed import ManagedModel
from ._status import Breaker, ModelState, ModelStatus
from ._supervisor import Supervisor

__all__ = [
    "Breaker",
    "Event",
    "EventBus",
    "EventKind",
    "LaunchPlan",
    "LoadOptions",
    "LocalModel",
    "ManagedModel",
    "ModelSpec",
    "ModelState",
    "ModelStatus",
    "Supervisor",
    "aload_model",
    "load_model",
    "plan_local_load",
]
