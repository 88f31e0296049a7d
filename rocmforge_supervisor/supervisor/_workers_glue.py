"""From a model that goes to RPC workers to its child's spec: ask the workers, plan, build the spec.

Kept apart from the supervisor's local path so that the only changes there are the branch into
:func:`prepare_on_workers` and the retry of :class:`._remote.WorkersUnavailable`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import anyio

from ..hardware import Inventory, child_env, discover_workers
from ..process import InstanceSpec
from ..settings import ForgeSettings
from ._managed import ManagedModel, Prepared, SupervisionPolicy
from ._remote import plan_on_workers

__all__ = ["prepare_on_workers", "uses_workers"]

#: Seconds a worker may take to answer the device probe (a held one never answers).
PROBE_TIMEOUT = 10.0


def uses_workers(config: Any, model_config: Any) -> str:
    """``never``, ``auto`` (when it does not fit here), ``only`` or ``all``; ``never`` without
    [[workers]]. ``only`` and ``all`` both skip this machine's devices."""
    if not getattr(config, "workers", None):
        return "never"
    return str(getattr(model_config, "workers", "auto"))


def _held(models: Iterable[ManagedModel], me: ManagedModel) -> set[str]:
    held: set[str] = set()
    for other in models:
        if other is not me and other.running and other.prepared is not None:
            held.update(str(w["worker"]) for w in other.prepared.workers)
    return held


async def prepare_on_workers(
    m: ManagedModel,
    path: Path,
    info: Any,
    *,
    config: Any,
    settings: ForgeSettings,
    binary: Path,
    inventory: Inventory,
    models: Iterable[ManagedModel],
    policy: SupervisionPolicy,
    log_dir: Path,
    state_dir: Path,
    extra_args: list[str],
    listeners: list[Callable[[str], None]],
) -> Prepared:
    """Every layer on workers (WorkersUnavailable when they cannot hold it now)."""
    held = _held(models, m)
    free = [w.address for w in config.workers if w.address not in held]
    reports = await anyio.to_thread.run_sync(lambda: discover_workers(binary, free, timeout=PROBE_TIMEOUT))
    mc = m.config
    plan = plan_on_workers(
        info,
        reports,
        ctx_size=getattr(mc, "ctx_size", None),
        parallel=getattr(mc, "parallel", None),
        held=held,
        name=m.name,
        spread=getattr(mc, "workers", "auto") == "all",
    )
    spec = InstanceSpec(
        binary=binary,
        model_path=path,
        alias=m.name,
        ctx_size=getattr(mc, "ctx_size", None) or plan.estimate.ctx_size,
        n_gpu_layers="all",
        parallel=getattr(mc, "parallel", None),
        extra_args=[*extra_args, *plan.child_args()],
        mask=child_env([], inventory, settings),  # this machine's GPUs stay out of a worker plan
        log_path=log_dir / f"{m.name}.log",
        state_dir=state_dir,
        stall_timeout=policy.load_stall_timeout,
        stop_timeout=policy.stop_timeout,
        line_listeners=listeners,
    )
    return Prepared(
        spec=spec,
        devices=plan.keys,
        estimated_bytes=plan.estimated_bytes,
        workers=plan.shares(),
        skipped_workers=plan.skipped,
    )
