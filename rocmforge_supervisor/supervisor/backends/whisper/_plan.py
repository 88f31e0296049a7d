"""The launch pipeline for a ``backend = "whisper"`` model: whisper.cpp's whisper-server.

Resolve (the file, its ggml header checked by :func:`~..models.inspect_whisper`, and the binary),
then the pipeline every given-size model takes (:func:`~._sized_plan.plan_sized`): placed on one
device by :func:`~._placement.place` like every model (idle models evicted for room, the residency
rules, the refusals), run as an :class:`~..process.InstanceSpec` with ``program=WHISPER_SERVER``
(the process layer builds whisper-server's argv and runs it like any child).

Memory: the estimate is the file plus whisper.cpp's state (:func:`~..models.whisper_state_bytes`);
the child's own allocation lines replace it once it has loaded (:class:`~..models.WhisperLedgerFeed`
feeds the plan's ledger), so placement of other models counts what it really holds.

A whisper-server built for the CPU only runs on the CPU whatever ``gpu`` says (placing it on a GPU
would count memory it never uses); a HIP/CUDA build goes to the GPU with the most free memory that
holds it, else the CPU; a GPU list places it on its first GPU (the model is loaded whole).
"""

from __future__ import annotations

from pathlib import Path

import anyio

from ....binaries import locate_whisper_server
from ....binaries._locate import build_info_of
from ....config import ForgeSettings, GpuChoice
from ....models import (
    GGUFInfo,
    WhisperLedgerFeed,
    inspect_whisper,
    resolve_hf_file,
    resolve_model_path,
    whisper_state_bytes,
)
from ....process import WHISPER_SERVER
from ...launch._launch import LaunchPlan
from ...placement._placement_types import SizedRequest
from .._host import HostedModel, PlacementHost
from .._sized_plan import SizedChild, plan_sized

__all__ = ["plan_whisper", "whisper_request"]


def whisper_request(name: str, info: GGUFInfo, gpu: GpuChoice, *, gpu_capable: bool) -> SizedRequest:
    """What placement sizes of a whisper model (pure): its file as weights, whisper.cpp's state
    beside it, on one device; the CPU for a build that cannot use a GPU."""
    weights = info.file_size_bytes
    return SizedRequest(
        name=name,
        what="whisper model",
        gpu=gpu if gpu_capable else "cpu",
        weights_bytes=weights,
        compute_bytes=whisper_state_bytes(weights),
        gpu_layers=info.block_count,
        flash_attn=True,
        one_device=True,
        size_note="estimated: the file plus whisper.cpp's state",
        advice="choose a smaller whisper model",
    )


def _resolve(ref: str, settings: ForgeSettings) -> tuple[Path, GGUFInfo, bool]:
    """(binary, model info, whether the binary can use a GPU): blocking (may download ``hf:``)."""
    binary = locate_whisper_server(settings)
    meta = build_info_of(binary)
    gpu_capable = meta is None or meta.get("backend") not in ("cpu", None)
    # hf:org/repo:FILE names a file: a whisper model is no GGUF with quants to choose from.
    path = resolve_hf_file(ref[3:], settings) if ref.startswith("hf:") else resolve_model_path(ref, settings)
    info = inspect_whisper(path)
    return binary, info, gpu_capable


async def plan_whisper(host: PlacementHost, m: HostedModel) -> LaunchPlan:
    """The supervisor's plan for a whisper model."""
    binary, info, gpu_capable = await anyio.to_thread.run_sync(_resolve, m.config.path, host.settings)
    request = whisper_request(m.name, info, m.config.gpu, gpu_capable=gpu_capable)
    return await plan_sized(
        host, m, SizedChild(request, info, binary, WHISPER_SERVER, ledger_feed=WhisperLedgerFeed)
    )
