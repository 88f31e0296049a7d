"""Supervision: in-process loads, placement, and the multi-model supervisor behind `forge serve`."""

from ._events import Event, EventBus, EventKind
from ._local import LoadOptions, LocalModel, aload_model, load_model, plan_local_load
from ._plan_inputs import dry_run
from ._supervisor import Supervisor
from ._view import ChildEndpoint, ModelView
from .backends._backends import BACKENDS, Backend, backend_of
from .contexts._conversations import ConversationTurn
from .launch._launch import LaunchPlan, ModelSpec
from .model._managed import ManagedModel
from .model._status import Breaker, ModelState, ModelStatus
from .placement._config_plan import ConfigPlan, ModelPlan

__all__ = [
    "BACKENDS",
    "Backend",
    "Breaker",
    "ChildEndpoint",
    "ConfigPlan",
    "ConversationTurn",
    "Event",
    "EventBus",
    "EventKind",
    "LaunchPlan",
    "LoadOptions",
    "LocalModel",
    "ManagedModel",
    "ModelPlan",
    "ModelSpec",
    "ModelState",
    "ModelStatus",
    "ModelView",
    "Supervisor",
    "aload_model",
    "backend_of",
    "dry_run",
    "load_model",
    "plan_local_load",
]
