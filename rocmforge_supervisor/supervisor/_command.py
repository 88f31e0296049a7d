"""The launch pipeline of a ``backend = "command"`` model: any OpenAI-compatible server the user
names (vLLM or SGLang on a ROCm box, koboldcpp, stable-diffusion.cpp's server, another llama-server
build), run by the same lifecycle as every child.

forge cannot read such a model's size, so placement takes the user's ``memory`` (per device it is
placed on) and places it like a whisper model: the devices ``gpu`` names, or (``auto``) the GPU with
the most free memory that holds it, else the CPU. Without ``memory`` it is placed where ``gpu``
says without a memory check (``auto``: the GPU with the most free memory). It gets the device mask
of those devices, so a GPU server sees only them.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from .._errors import PlacementError
from .._units import format_bytes
from ..config import GpuChoice, ModelConfig
from ..hardware import Device, Inventory, child_env
from ..models import AllocationLedger, DeviceEstimate, GGUFInfo, MemoryEstimate
from ..process import CommandProgram, InstanceSpec
from ._evicting import evict_by_group, loaded_others
from ._host import PlacementHost
from ._launch import LaunchPlan
from ._placement import _chosen
from ._placement_types import LoadedModel, PlacementDecision, free_memory

if TYPE_CHECKING:
    from ._managed import ManagedModel

__all__ = ["command_info", "decide_command", "plan_command"]


def decide_command(
    name: str, memory: int | None, gpu: GpuChoice, inventory: Inventory, loaded: Sequence[LoadedModel]
) -> PlacementDecision:
    """Where the command goes (pure): its devices, or :class:`PlacementError` with the numbers."""
    need = memory or 0
    free = free_memory(inventory, [m for m in loaded if m.name != name])
    choice = _chosen(inventory, gpu)
    if choice == "auto":
        gpus = sorted((d for d in inventory.gpus if d.usable), key=lambda d: free.get(d.key, 0), reverse=True)
        options: list[list[Device]] = [[d] for d in gpus] + [[inventory.cpu]]
    elif choice == "cpu":
        options = [[inventory.cpu]]
    else:
        options = [list(choice)]
    for devices in options:
        if all(free.get(d.key, 0) >= need for d in devices):
            return _decision(devices, need, memory)
    where = ", ".join(f"{d.key} {format_bytes(free.get(d.key, 0))} free" for ds in options for d in ds)
    raise PlacementError(
        f"command model {name!r} needs {format_bytes(need)} per device (its memory) and no choice "
        f"has that free ({where})",
        hint="unload another model (forge unload NAME), or lower the model's memory if it needs less",
    )


def _decision(devices: list[Device], need: int, memory: int | None) -> PlacementDecision:
    keys = tuple(d.key for d in devices)
    estimate = MemoryEstimate(
        devices=tuple(DeviceEstimate(device=k, weights_bytes=need) for k in keys),
        n_gpu_layers=0,
        ctx_size=0,
        parallel=1,
        kv_unified=False,
        cache_type_k="f16",
        cache_type_v="f16",
        flash_attn=False,
    )
    told = (
        f"{format_bytes(need)} per device, as configured" if memory is not None else "memory not configured"
    )
    return PlacementDecision(
        devices=keys,
        n_gpu_layers=0,
        tensor_split=None,
        evict=[],
        estimate=estimate,
        need_bytes={k: need for k in keys},
        reason=f"command on {', '.join(keys)} ({told})",
    )


def command_info(name: str, config: ModelConfig) -> GGUFInfo:
    """What the status and the listing show of a model forge cannot read: its name, the memory
    the user gave (as its size) and no chat template of forge's knowing."""
    return GGUFInfo.outside(
        Path(config.path),
        architecture="command",
        name=name,
        file_type="command",
        has_chat_template=True,  # an OpenAI chat server templates its own chats
        size_bytes=config.memory or 0,
    )


def program_of(config: ModelConfig) -> CommandProgram:
    return CommandProgram(
        cmd=tuple(config.cmd),
        health=config.health or "/health",
        ready_log=config.ready_log,
        extra_env=dict(config.env),
        model=config.path,
    )


async def plan_command(host: PlacementHost, m: ManagedModel) -> LaunchPlan:
    """The supervisor's plan for a command model (placement under its lock)."""
    config = m.config
    async with host.placement_lock:
        await evict_by_group(host, m)
        inventory = await host.refresh_inventory()
        loaded = loaded_others(host, m)
        decision = decide_command(m.name, config.memory, config.gpu, inventory, loaded)
    devices = [inventory.by_key(k) for k in decision.devices]
    gpus = [k for k in decision.devices if k != "cpu"]
    info = command_info(m.name, config)
    spec = InstanceSpec(
        binary=Path(config.cmd[0]),
        model_path=Path(config.path),
        alias=m.name,
        extra_args=list(config.args),
        api_key="",  # an unknown program takes no key file: loopback only, the gateway's keys guard it
        mask=child_env(devices, inventory, host.settings),
        cpu_only=decision.on_cpu,
        log_path=host.log_dir / f"{m.name}.log",
        state_dir=host.state_dir,
        stall_timeout=host.policy.load_stall_timeout,
        ready_timeout=host.policy.load_deadline(config.memory or 0),
        stop_timeout=host.policy.stop_timeout,
        line_listeners=[host.log_forwarder(m.name)],
        program=program_of(config),
    )
    ledger = AllocationLedger(gpu_keys=gpus or None)
    return LaunchPlan(spec=spec, decision=decision, model_path=Path(config.path), info=info, actual=ledger)
