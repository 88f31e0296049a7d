"""Placing a model on llama.cpp RPC workers: which workers, what share each, the child's flags.

Pure, like :mod:`._placement`: given what the workers reported (:func:`..hardware.discover_workers`)
and which workers our other models hold, pick the fewest workers (most free memory first) whose
devices hold every layer, split by their free memory, and check each share against what that
device has free. The local machine keeps what llama-server always keeps in host memory (the
input embeddings); its GPUs are not used in such a plan (a mixed local + remote split is not done
yet).

A worker belongs to one model at a time: rpc-server serves one client until it disconnects, so a
second llama-server would wait forever on a held worker.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from ..._argv import rpc_args
from ..._errors import PlacementError
from ...hardware import WorkerDevice, WorkerReport
from ...models import GGUFInfo, MemoryEstimate, estimate_memory
from ._placement_types import PlacementDecision, WorkerShare

__all__ = ["RemotePlan", "WorkersUnavailable", "plan_on_workers"]

_MIB = 1 << 20
_MARGIN = 0.05  # the estimate is within ~10 %; the placer asks the same of local devices
_RESERVE = 128 * _MIB


class WorkersUnavailable(PlacementError):
    """The model needs workers that are down, busy or too full now: worth retrying later."""


@dataclass(frozen=True)
class RemotePlan:
    """Where the layers go: ``devices`` in llama-server's order (``--rpc`` order, then each
    worker's), ``tensor_split`` the share of each."""

    devices: tuple[WorkerDevice, ...]
    tensor_split: tuple[float, ...]
    estimate: MemoryEstimate
    skipped: dict[str, str] = field(default_factory=dict)
    """Worker address → why it was not used (down, busy, held by another model)."""

    @property
    def addresses(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(d.address for d in self.devices))

    @property
    def keys(self) -> list[str]:
        return [d.key for d in self.devices]

    @property
    def estimated_bytes(self) -> dict[str, int]:
        return {k: v for k, v in self.estimate.by_device.items() if v}

    def child_args(self) -> list[str]:
        """``--rpc`` and ``--tensor-split`` (with every layer offloaded: ``-ngl all``)."""
        return rpc_args(self.addresses, self.tensor_split)

    def worker_shares(self) -> tuple[WorkerShare, ...]:
        """Which worker holds what."""
        return tuple(
            WorkerShare(
                worker=d.address,
                device=d.index,
                share=s,
                layers=self.estimate.device(d.key).layers,
                estimated_bytes=self.estimate.bytes_on(d.key),
            )
            for d, s in zip(self.devices, self.tensor_split, strict=True)
        )

    def shares(self) -> list[dict[str, object]]:
        """For ``forge ps`` / ``/api/models``: which worker holds what."""
        return [w.to_json() for w in self.worker_shares()]

    def as_decision(self) -> PlacementDecision:
        """The launch pipeline's decision: every layer on these workers, nothing here evicted."""
        skipped = "; ".join(f"{a}: {why}" for a, why in self.skipped.items())
        return PlacementDecision(
            devices=tuple(self.keys),
            n_gpu_layers=self.estimate.n_gpu_layers,
            tensor_split=list(self.tensor_split),
            evict=[],
            estimate=self.estimate,
            need_bytes={},
            reason=f"every layer on RPC workers {', '.join(self.addresses)}"
            + (f" (left out: {skipped})" if skipped else ""),
            workers=self.worker_shares(),
        )


def plan_on_workers(
    info: GGUFInfo,
    reports: Sequence[WorkerReport],
    *,
    ctx_size: int | None,
    parallel: int | None,
    kv_unified: bool = True,
    held: Collection[str] = (),
    name: str = "model",
    spread: bool = False,
    embeddings: bool = False,
    draft: GGUFInfo | None = None,
    draft_on_gpu: bool = True,
) -> RemotePlan:
    """The smallest set of workers that holds the whole model (``spread``: every usable worker),
    or WorkersUnavailable saying why. ``draft``: a speculative-decoding draft, split over the same
    devices (or in this machine's RAM when not ``draft_on_gpu``)."""
    skipped = {r.address: r.detail or r.state for r in reports if r.state != "ok"}
    skipped.update({a: "in use by another model" for a in held})
    usable = [r for r in reports if r.state == "ok" and r.address not in held and r.devices]
    usable = list({r.address: r for r in usable}.values())  # one worker listed twice is one worker
    ranked = sorted(usable, key=lambda r: -r.free_bytes)
    best_short: tuple[str, int] | None = None
    # No usable worker: no plan at all (range(0, 1) would plan zero devices, i.e. the local CPU).
    for k in range(max(1, len(ranked)) if spread else 1, len(ranked) + 1):
        chosen = [r for r in usable if r in ranked[:k]]  # keep the configured order
        devices = [d for r in chosen for d in r.devices]
        room = [max(1, d.free_bytes - _RESERVE) for d in devices]
        split = tuple(round(x / sum(room), 4) for x in room)
        est = estimate_memory(
            info,
            n_gpu_layers=None,
            ctx_size=ctx_size or 0,
            parallel=parallel,
            kv_unified=kv_unified,
            devices=tuple(d.key for d in devices),
            tensor_split=split,
            embeddings=embeddings,
            draft=draft,
            draft_on_gpu=draft_on_gpu,
        )
        over = {  # a device with no share (nearly full) holds nothing: it cannot be over
            d.key: int(est.bytes_on(d.key) * (1 + _MARGIN)) + _RESERVE - d.free_bytes
            for d in devices
            if est.bytes_on(d.key) > 0 and int(est.bytes_on(d.key) * (1 + _MARGIN)) + _RESERVE > d.free_bytes
        }
        if not over:
            return RemotePlan(tuple(devices), split, est, skipped)
        worst = max(over.items(), key=lambda kv: kv[1])
        best_short = worst if best_short is None or worst[1] < best_short[1] else best_short
    why = "; ".join(f"{a}: {w}" for a, w in skipped.items())
    if best_short is not None:
        detail = f"the {len(usable)} usable worker(s) lack {best_short[1] / 2**30:.1f} GiB on {best_short[0]}"
    else:
        detail = "no worker is usable"
    raise WorkersUnavailable(
        f"{name} does not fit on the RPC workers: {detail}" + (f" ({why})" if why else ""),
        hint="start `forge worker` on more machines (and list them in [[workers]]), "
        "or lower ctx_size; forge retries when a worker comes back",
    )
