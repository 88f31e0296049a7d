"""A model's side of ``keep_context``: when its child's slots are saved and restored.

:class:`~._keep_context.ContextKeeper` talks to the child's ``/slots``; these are the moments of
the model's life that call it: the restore before ``ready`` lets the first request through, the
save at a planned stop (within ``stop_timeout``, never taking the child's SIGTERM grace away) and
at a reload that starts the replacement first. Kept apart from :mod:`._managed` for size.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from ._status import ModelState, SupervisedModel

if TYPE_CHECKING:
    from ...process import ModelServer
    from ..launch._launch import LaunchPlan

__all__ = ["keeps_context", "restore_context", "save_context", "snapshot_context"]

#: Planned stops whose slots are not worth saving (the model is gone from the config).
_NO_SAVE = frozenset({"removed", "failed replacement"})


def keeps_context(m: SupervisedModel, plan: LaunchPlan | None) -> bool:
    """The child was started to keep its context (``--slot-save-path`` in its flags)."""
    return m.contexts is not None and plan is not None and plan.slot_save_dir is not None


async def restore_context(m: SupervisedModel, server: ModelServer, plan: LaunchPlan) -> None:
    """Saved slots back into the new child before ``ready`` lets the first request through."""
    if keeps_context(m, plan) and m.contexts is not None and not m.stopping():
        await m.contexts.restore(server, plan)


async def save_context(m: SupervisedModel, server: ModelServer, reason: str) -> float:
    """At a planned stop: save the slots within ``stop_timeout``. Returns the seconds left of
    it for the stop itself (at least 1 s of grace: the save never takes the child's SIGTERM
    grace away entirely)."""
    budget = m.policy.stop_timeout
    plan = m.plan
    if reason in _NO_SAVE or not keeps_context(m, plan) or not server.alive:
        return budget
    if m.sleeping:  # sleeping freed the KV cache, and a save would wake (reload) the model
        return budget
    assert m.contexts is not None and plan is not None
    started = time.monotonic()
    await m.contexts.save(server, plan, timeout=budget)
    return max(1.0, budget - (time.monotonic() - started))


async def snapshot_context(m: SupervisedModel) -> None:
    """Save the slots of the running child without stopping it (bounded by ``stop_timeout``):
    a reload's replacement restores them while this child still serves (start-new-first)."""
    server = m.server
    if m.state == ModelState.READY and server is not None:
        await save_context(m, server, "reload")
