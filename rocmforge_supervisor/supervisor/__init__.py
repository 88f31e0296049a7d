"""Supervision: in-process loads, placement, and the multi-model supervisor behind `forge serve`."""

from ._backends import BACKENDS, Backend, backend_of
from ._config_plan import ConfigPlan, ModelPlan
from ._conversations import ConversationTurn
from ._events import Event, EventBus, EventKind
from ._launch import LaunchPlan, ModelSpec
from ._local import LoadOptions, LocalModel, aload_model, load_model, plan_local_load
from ._managed import ManagedModel
from ._plan_inputs import dry_run
from ._status import Breaker, ModelState, ModelStatus
from ._supervisor import Supervisor
from ._view import ChildEndpoint, ModelView

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
