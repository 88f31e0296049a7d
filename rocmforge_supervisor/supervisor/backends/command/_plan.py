"""The launch pipeline of a ``backend = "command"`` model: any OpenAI-compatible server the user
names (vLLM or SGLang on a ROCm box, koboldcpp, stable-diffusion.cpp's server, another llama-server
build), run by the same lifecycle as every child.

forge cannot read such a model's size, so placement takes the user's ``memory`` (per device it is
placed on) and places it by the pipeline every given-size model takes (:func:`~._sized_plan.plan_sized`
→ :func:`~._placement.place`, as a whisper model): the devices ``gpu`` names, or (``auto``) the
GPU with the most free memory that holds it, else the CPU; idle models are evicted for room and the
residency rules apply as for any model. Without ``memory`` it is placed where ``gpu`` says without
a memory check (``auto``: the GPU with the most free memory). It gets the device mask of those
devices, so a GPU server sees only them.
"""

from __future__ import annotations

from pathlib import Path

from ....config import ModelConfig
from ....models import GGUFInfo
from ...launch._launch import LaunchPlan
from ...placement._placement_types import SizedRequest
from .._host import HostedModel, PlacementHost
from .._sized_plan import SizedChild, plan_sized
from ._program import CommandProgram

__all__ = ["command_info", "command_request", "plan_command"]


def command_request(name: str, config: ModelConfig) -> SizedRequest:
    """What placement sizes of a command (pure): its ``memory`` on each device it is placed on."""
    return SizedRequest(
        name=name,
        what="command model",
        gpu=config.gpu,
        weights_bytes=config.memory or 0,
        size_note="its memory, as configured" if config.memory is not None else "memory not configured",
        advice="lower the model's memory if it needs less",
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


async def plan_command(host: PlacementHost, m: HostedModel) -> LaunchPlan:
    """The supervisor's plan for a command model."""
    config = m.config
    child = SizedChild(
        command_request(m.name, config),
        command_info(m.name, config),
        binary=Path(config.cmd[0]),
        program=program_of(config),
    )
    return await plan_sized(host, m, child)
