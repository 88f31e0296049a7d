"""Step 1 of a model's life (``ManagedModel.prepare``): its launch plan, and what each way a plan
can fail means for the model.

Workers down or busy, or its group's members busy: the model waits (``loading``) and plans again.
A residency rule that forbids the load now: refused, not failed (409 to the requests that waited
on it). A broken input or a bug: the model fails, with the reason. A warm default (a start without
a request) that does not fit now gives up quietly instead. Kept apart from :mod:`._managed` for
size: these are the model's own steps, and they set its state as its methods do.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import anyio

from ..._errors import ForgeError, ModelNotFound, PlacementError, ResidencyBusy, ResidencyConflict
from .._events import EventKind
from ..placement._remote import WorkersUnavailable
from ._status import ModelState, SupervisedModel

if TYPE_CHECKING:
    from ..launch._launch import LaunchPlan

__all__ = ["plan_start"]

log = logging.getLogger("rocmforge.supervisor")

#: Seconds between re-plans while a group's members are all busy.
_GROUP_POLL = 0.5


async def plan_start(m: SupervisedModel) -> LaunchPlan | None:
    """Step 1: the launch plan (placement may evict others); None when it cannot be made."""
    if m.state != ModelState.LOADING:
        m._set_state(ModelState.LOADING, restarts=m.restarts)
    m.loading_since = time.monotonic()
    waiting = False  # for its group's busy members: said once
    while not m.stopping():
        try:
            return await m._plan(m)
        except WorkersUnavailable as exc:  # workers down or busy, not a broken model: re-plan
            m.last_error = str(exc)
            m.events.publish(m.name, EventKind.WAITING, reason="workers", message=exc.message)
            m._set_state(ModelState.LOADING, waiting_for="workers", retry_in=m.restart.delay)
            # Wait before the next start (an unload ends the wait), then double it.
            await m.restart.wait(m.stop_event)
        except ResidencyBusy as exc:  # its group's members are busy: re-plan when one is idle
            if m.warming:
                _gave_up_warming(m, exc)
                return None
            if not waiting:
                waiting = True
                m.events.publish(m.name, EventKind.WAITING, reason="group", rule=exc.rule)
                m._set_state(ModelState.LOADING, waiting_for="group", message=exc.message)
            # Polled: a member going idle is another model's event; a load waits seconds anyway.
            with anyio.move_on_after(_GROUP_POLL):
                await m.stop_event.wait()
        except ResidencyConflict as exc:  # a rule forbids it now: refused, not failed
            if m.warming:
                _gave_up_warming(m, exc)
                return None
            m.refused = exc
            m.last_error = str(exc)
            m.events.publish(m.name, EventKind.REFUSED, rule=exc.rule, message=exc.message)
            log.warning("model %s: load refused: %s", m.name, exc, extra={"model": m.name})
            return None
        except ForgeError as exc:
            if m.warming and isinstance(exc, PlacementError):
                _gave_up_warming(m, exc)
                return None
            kind = (
                "placement"
                if isinstance(exc, PlacementError)
                else "file_not_found"
                if isinstance(exc, ModelNotFound)
                else "invalid"
            )
            m._fail(str(exc), [], kind=kind)
            return None
        except Exception as exc:  # a bug must fail this model, not the whole service
            log.exception("model %s: planning the start failed", m.name)
            m._fail(f"internal error while planning the start: {exc!r}", [], kind="internal")
            return None
    return None


def _gave_up_warming(m: SupervisedModel, exc: PlacementError) -> None:
    """The warm default does not fit now (or would unload another model): no failure, no
    refusal; the supervisor tries again when memory is freed. Why is logged once per cause
    (a rule, or memory), not at every try."""
    cause = (type(exc).__name__, getattr(exc, "rule", None))
    level = logging.DEBUG if cause == m._warm_cause else logging.INFO
    m._warm_cause = cause
    log.log(
        level,
        "model %s: the warm default stays unloaded for now: %s",
        m.name,
        exc,
        extra={"model": m.name},
    )
    return None
