"""The launch pipeline for a ``backend = "whisper"`` model: whisper.cpp's whisper-server.

The same three steps as llama-server's (:mod:`._launch`), much shorter: resolve (the file, its
ggml header checked by :func:`~..models.inspect_whisper`), decide (one device: the model is loaded
whole, there are no layers to split), plan (an :class:`~..process.InstanceSpec` with
``program=WHISPER_SERVER``: the process layer builds whisper-server's argv and runs it like any child).

Memory: the estimate is the file plus whisper.cpp's state (:func:`~..models.whisper_state_bytes`);
the child's own allocation lines replace it once it has loaded (:class:`~..models.WhisperLedgerFeed`
feeds the plan's ledger), so placement of other models counts what it really holds.

A whisper-server built for the CPU only runs on the CPU whatever ``gpu`` says (placing it on a GPU
would count memory it never uses); a HIP/CUDA build goes to the GPU with the most free memory that
holds it, else the CPU. Idle models are not evicted for it (it is small): when nothing holds it the
load fails with the numbers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import anyio

from .._errors import PlacementError
from .._units import format_bytes
from ..binaries import locate_whisper_server
from ..binaries._locate import build_info_of
from ..config import ForgeSettings, GpuChoice
from ..hardware import Device, Inventory, child_env
from ..models import (
    AllocationLedger,
    DeviceEstimate,
    GGUFInfo,
    MemoryEstimate,
    WhisperLedgerFeed,
    inspect_whisper,
    resolve_hf_file,
    resolve_model_path,
    whisper_state_bytes,
)
from ..process import WHISPER_SERVER, InstanceSpec
from ._evicting import evict_by_group, loaded_others
from ._host import PlacementHost
from ._launch import LaunchPlan
from ._placement import _chosen
from ._placement_types import LoadedModel, PlacementDecision, free_memory

if TYPE_CHECKING:
    from ._managed import ManagedModel

__all__ = ["decide_whisper", "plan_whisper"]


def decide_whisper(
    name: str,
    info: GGUFInfo,
    gpu: GpuChoice,
    inventory: Inventory,
    loaded: Sequence[LoadedModel],
    *,
    gpu_capable: bool,
) -> PlacementDecision:
    """Where the whisper model goes (pure): one device, or :class:`PlacementError` with the numbers."""
    weights = info.file_size_bytes
    state = whisper_state_bytes(weights)
    need = weights + state
    free = free_memory(inventory, [m for m in loaded if m.name != name])
    choice = _chosen(inventory, gpu) if gpu_capable else "cpu"
    candidates: list[Device]
    if choice == "cpu":
        candidates = [inventory.cpu]
    elif choice == "auto":
        gpus = sorted((d for d in inventory.gpus if d.usable), key=lambda d: free.get(d.key, 0), reverse=True)
        candidates = [*gpus, inventory.cpu]
    else:
        candidates = list(choice[:1])
    for dev in candidates:
        if free.get(dev.key, 0) >= need:
            estimate = MemoryEstimate(
                devices=(DeviceEstimate(device=dev.key, weights_bytes=weights, compute_bytes=state),),
                n_gpu_layers=0 if dev.vendor == "cpu" else info.block_count,
                ctx_size=0,
                parallel=1,
                kv_unified=False,
                cache_type_k="f16",
                cache_type_v="f16",
                flash_attn=True,
            )
            return PlacementDecision(
                devices=(dev.key,),
                n_gpu_layers=estimate.n_gpu_layers,
                tensor_split=None,
                evict=[],
                estimate=estimate,
                need_bytes={dev.key: need},
                reason=f"whisper model on {dev.key} ({format_bytes(need)} estimated)",
            )
    where = ", ".join(f"{d.key} {format_bytes(free.get(d.key, 0))} free" for d in candidates)
    raise PlacementError(
        f"whisper model {name!r} needs about {format_bytes(need)} and no device has that free ({where})",
        hint="unload another model (forge unload NAME), or choose a smaller whisper model",
    )


def plan_launch(
    name: str,
    info: GGUFInfo,
    decision: PlacementDecision,
    inventory: Inventory,
    settings: ForgeSettings,
    *,
    binary: Path,
    args: Sequence[str],
    log_path: Path,
    state_dir: Path,
    stall_timeout: float,
    ready_timeout: float | None,
    stop_timeout: float,
    line_listeners: Sequence[Callable[[str], object]] = (),
) -> LaunchPlan:
    """The child's mask, flags and ledger (pure, apart from the device mask's settings)."""
    devices = [inventory.by_key(k) for k in decision.devices]
    gpus = [d for d in decision.devices if d != "cpu"]
    ledger = AllocationLedger(gpu_keys=gpus or None)
    instance = InstanceSpec(
        binary=binary,
        model_path=info.path,
        alias=name,
        extra_args=list(args),
        api_key="",  # whisper-server has no API key; the child listens on loopback only
        mask=child_env(devices, inventory, settings),
        cpu_only=decision.on_cpu,
        log_path=log_path,
        state_dir=state_dir,
        stall_timeout=stall_timeout,
        ready_timeout=ready_timeout,
        stop_timeout=stop_timeout,
        line_listeners=[WhisperLedgerFeed(ledger, gpus or None), *line_listeners],
        program=WHISPER_SERVER,
    )
    return LaunchPlan(spec=instance, decision=decision, model_path=info.path, info=info, actual=ledger)


def _resolve(ref: str, settings: ForgeSettings) -> tuple[Path, GGUFInfo, bool]:
    """(binary, model info, whether the binary can use a GPU): blocking (may download ``hf:``)."""
    binary = locate_whisper_server(settings)
    meta = build_info_of(binary)
    gpu_capable = meta is None or meta.get("backend") not in ("cpu", None)
    # hf:org/repo:FILE names a file: a whisper model is no GGUF with quants to choose from.
    path = resolve_hf_file(ref[3:], settings) if ref.startswith("hf:") else resolve_model_path(ref, settings)
    info = inspect_whisper(path)
    return binary, info, gpu_capable


async def plan_whisper(sup: PlacementHost, m: ManagedModel) -> LaunchPlan:
    """The supervisor's ``_plan`` for a whisper model (placement under its lock)."""
    binary, info, gpu_capable = await anyio.to_thread.run_sync(_resolve, m.config.path, sup.settings)
    async with sup.placement_lock:
        await evict_by_group(sup, m)
        inventory = await sup.refresh_inventory()
        loaded = loaded_others(sup, m)
        decision = decide_whisper(m.name, info, m.config.gpu, inventory, loaded, gpu_capable=gpu_capable)
    return plan_launch(
        m.name,
        info,
        decision,
        inventory,
        sup.settings,
        binary=binary,
        args=m.config.args,
        log_path=sup.log_dir / f"{m.name}.log",
        state_dir=sup.state_dir,
        stall_timeout=sup.policy.load_stall_timeout,
        ready_timeout=sup.policy.load_deadline(info.file_size_bytes),
        stop_timeout=sup.policy.stop_timeout,
        line_listeners=[sup.log_forwarder(m.name)],
    )
