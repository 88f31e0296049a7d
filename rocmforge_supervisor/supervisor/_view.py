"""A model as the gateway may read it: one frozen snapshot per model, made by the supervisor.

The HTTP layer (``service/``) answers listings, metrics and the status page from what a model is
now: its state, the child to send to, the geometry it was started with, what it holds. It reads
that here, never ``ManagedModel``'s attributes: the supervisor's internals can change without the
gateway noticing, and a reader cannot change a model by accident (the snapshot is frozen).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..config import ModelConfig
from ..models import ProjectorInfo
from .model._status import ModelState, ModelStatus
from .placement._placement_types import WorkerShare

if TYPE_CHECKING:
    from ._peers import PeerModel
    from .model._managed import ManagedModel

__all__ = ["ChildEndpoint", "ModelView", "model_view", "peer_view"]


@dataclass(frozen=True)
class ChildEndpoint:
    """The running child's address: where the gateway scrapes ``/metrics`` and ``/slots``."""

    base_url: str
    api_key: str
    pid: int | None

    def headers(self) -> dict[str, str]:
        """The child's key, when it has one (``""``: a loopback child run without a key)."""
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


@dataclass(frozen=True)
class ModelView:
    """One model now, read-only (:meth:`Supervisor.view <._supervisor.Supervisor.view>`)."""

    name: str
    state: ModelState
    config: ModelConfig
    """Its ``[models.NAME]`` section (frozen)."""
    status: ModelStatus
    """What ``GET /api/models`` reports of it (the same snapshot)."""
    child: ChildEndpoint | None
    """The child's address while its process lives; None otherwise."""
    sleeping: bool
    """The child freed its model (``sleep_idle``): a request to it would reload the model."""
    started: bool
    """It has a launch plan (it was started at least once since its config last changed)."""
    model_path: Path | None
    """The GGUF its child was started on; None before the first start."""
    ctx_size: int | None
    """``--ctx-size`` as its child was started (None: not started, or llama-server's default)."""
    parallel: int | None
    """``--parallel`` as its child was started."""
    ctx_per_request: int | None
    """Tokens one request can use: as its child was started, else as configured (None: the
    model's trained context, unknown until its GGUF is read)."""
    kv_unified: bool
    """Its slots share one KV cache (``--kv-unified``): as started, else as configured."""
    args: tuple[str, ...]
    """The child's extra llama-server arguments: as started, else as configured."""
    projector: ProjectorInfo | None
    """The ``--mmproj`` projector its child was started with."""
    held_bytes: Mapping[str, int]
    """device key → bytes it holds now (the child's own allocation once ready, else the estimate);
    empty when it holds nothing (as placement counts it)."""
    workers: tuple[WorkerShare, ...]
    ttl: float
    """Idle seconds before it is unloaded (0: never)."""
    stalls: int
    """Children the progress watchdog killed so far."""

    @property
    def ready(self) -> bool:
        return self.state == ModelState.READY

    @property
    def answering(self) -> ChildEndpoint | None:
        """The child to scrape: ready, alive and awake (a sleeping child's endpoints would wake it)."""
        return self.child if self.ready and not self.sleeping else None


def model_view(m: ManagedModel) -> ModelView:
    """The snapshot of ``m`` now."""
    server, plan = m.server, m.plan
    alive = server is not None and server.alive
    loaded = m.as_loaded()
    return ModelView(
        name=m.name,
        state=m.state,
        config=m.config,
        status=m.status(),
        child=ChildEndpoint(server.base_url, server.api_key, server.pid)
        if server is not None and alive
        else None,
        sleeping=m.sleeping and alive,
        started=plan is not None,
        model_path=plan.spec.model_path if plan is not None else None,
        ctx_size=plan.spec.ctx_size if plan is not None else None,
        parallel=plan.spec.parallel if plan is not None else None,
        ctx_per_request=plan.estimate.ctx_per_request
        if plan is not None
        else m.policy.per_request_of(m.config),
        kv_unified=plan.estimate.kv_unified if plan is not None else m.config.unified_kv,
        args=tuple(plan.spec.extra_args if plan is not None else m.config.args),
        projector=plan.projector if plan is not None else None,
        held_bytes={k: int(n) for k, n in loaded.bytes_by_device.items() if n > 0} if loaded else {},
        workers=tuple(plan.workers) if plan is not None and m.running else (),
        ttl=m.ttl,
        stalls=m.stalls,
    )


def peer_view(pm: PeerModel, status: ModelStatus) -> ModelView:
    """A peer's model as the gateway reads a model: its state, no child, no context of ours."""
    return ModelView(
        name=pm.served,
        state=status.state,
        config=pm.config,
        status=status,
        child=None,
        sleeping=False,
        started=False,
        model_path=None,
        ctx_size=None,
        parallel=None,
        ctx_per_request=None,
        kv_unified=False,
        args=(),
        projector=None,
        held_bytes={},
        workers=(),
        ttl=0.0,
        stalls=0,
    )
