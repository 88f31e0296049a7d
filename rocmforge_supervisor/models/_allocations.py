"""What a llama-server child really allocated, read from its log.

llama.cpp prints one line per buffer it allocates (at ``-lv 4``; see :data:`REQUIRED_VERBOSITY`)::

    load_tensors:   CPU_Mapped model buffer size =   235.16 MiB
    llama_kv_cache:        CPU KV buffer size =    15.00 MiB
    llama_context:        CPU  output buffer size =     4.00 MiB
    sched_reserve:        CPU compute buffer size =    19.77 MiB
    load_tensors:        ROCm0 model buffer size =  1918.35 MiB

These are the numbers the estimate is corrected by (Ollama reads the same lines). The buffer name
says the device: ``CPU*`` and ``*_Host`` (pinned host memory) are system RAM, ``ROCmN`` /
``CUDAN`` / ``VulkanN`` are the child's N-th GPU, which is not our ``amd:N`` when the child runs
under a device mask: :class:`AllocationLedger` takes the mask's order to translate.

A multimodal projector (``--mmproj``) is loaded by mtmd, which says it differently::

    clip_ctx: CLIP using ROCm0 backend
    load_hparams: model size:         0.11 MiB
    reserve_compute_meta:      ROCm0 compute buffer size =     0.02 MiB

Its weights are on the backend the first line names; both are the ``projector`` part.

A speculative-decoding draft model (``--spec-draft-model``) is loaded after the model, announced by
``common_speculative_init_result: loading draft model '…'``, and prints the same lines for its
own buffers: everything after that line is the ``draft`` part (and does not start a new load).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

__all__ = [
    "REQUIRED_VERBOSITY",
    "Allocation",
    "AllocationLedger",
    "Part",
    "buffer_device",
    "parse_allocation_line",
]

#: The ``-lv`` / ``--log-verbosity`` a child needs for its allocation lines to be printed.
REQUIRED_VERBOSITY = 4

Part = Literal["weights", "kv", "compute", "output", "projector", "draft"]

_LINE_RE = re.compile(
    r"(?:^|\s|:)(?P<buffer>[A-Za-z][\w.\[\]:-]*?)\s+"
    r"(?P<kind>model|KV|RS|compute|output|LoRA)\s+buffer size\s*=\s*(?P<mib>\d+(?:\.\d+)?)\s*MiB"
)
_PARTS: dict[str, Part] = {
    "model": "weights",
    "LoRA": "weights",
    "KV": "kv",
    "RS": "kv",  # recurrent state: the per-sequence memory of Mamba-style layers
    "compute": "compute",
    "output": "output",
}
_CLIP_BACKEND_RE = re.compile(r"CLIP using (?P<backend>[\w.\[\]:-]+) backend")
_CLIP_WEIGHTS_RE = re.compile(r"load_hparams: model size:\s*(?P<mib>\d+(?:\.\d+)?)\s*MiB")
_CLIP_COMPUTE_RE = re.compile(
    r"reserve_compute_meta:\s*(?P<buffer>[A-Za-z][\w.\[\]:-]*?)\s+compute buffer size\s*=\s*(?P<mib>\d+(?:\.\d+)?)\s*MiB"
)
_GPU_RE = re.compile(r"^(?P<backend>ROCm|CUDA|Vulkan|SYCL|MUSA|Metal)(?P<index>\d+)?(?P<suffix>_\w+)?$")
_VENDOR = {
    "ROCm": "amd",
    "CUDA": "nvidia",
    "MUSA": "musa",
    "Vulkan": "vulkan",
    "SYCL": "sycl",
    "Metal": "metal",
}
_MIB = 1024 * 1024
#: The line that starts a draft model's load (``common/speculative.cpp`` at the pin).
_DRAFT_LOAD = "loading draft model"


@dataclass(frozen=True)
class Allocation:
    """One buffer a child allocated: on which of our devices, for what, and how big."""

    device: str
    """Our device key (``cpu``, ``amd:0``, ``nvidia:1``)."""
    buffer: str
    """llama.cpp's buffer-type name (``CPU_Mapped``, ``ROCm0``, ``CUDA_Host``)."""
    part: Part
    bytes: int


def buffer_device(buffer: str, gpu_keys: Sequence[str] | None = None) -> str:
    """Our device key for a llama.cpp buffer-type name.

    ``gpu_keys[i]`` is our key for the child's i-th GPU (the order of its device mask); without
    it the child's ordinals are taken as ours (``ROCm1`` → ``amd:1``).
    """
    if buffer.startswith("CPU"):
        return "cpu"
    m = _GPU_RE.match(buffer)
    if m is None:
        return "cpu" if buffer.endswith("_Host") else buffer
    suffix = m["suffix"] or ""
    if suffix == "_Host":
        return "cpu"
    index = int(m["index"]) if m["index"] is not None else 0  # ``ROCm_Split``: row-split weights
    if gpu_keys is not None and index < len(gpu_keys):
        return gpu_keys[index]
    return f"{_VENDOR[m['backend']]}:{index}"


def parse_allocation_line(line: str, gpu_keys: Sequence[str] | None = None) -> Allocation | None:
    """The allocation a log line reports, or None for every other line."""
    if "buffer size" not in line:
        return None
    m = _LINE_RE.search(line)
    if m is None:
        return None
    buffer = m["buffer"]
    return Allocation(
        device=buffer_device(buffer, gpu_keys),
        buffer=buffer,
        part=_PARTS[m["kind"]],
        bytes=round(float(m["mib"]) * _MIB),
    )


@dataclass
class AllocationLedger:
    """Adds up a child's allocation lines, fed one log line at a time.

    With ``--fit on`` (llama-server's default) the child first loads the model in a dry run
    that prints the same lines at debug level, then loads it for real: a weights line that
    arrives after a KV or compute line starts a new load, and the earlier figures are dropped.
    """

    gpu_keys: Sequence[str] | None = None
    allocations: list[Allocation] = field(default_factory=list)
    _after_weights: bool = False
    _clip_backend: str = "CPU"
    _draft: bool = False
    """The draft model's load has begun: its buffers are the ``draft`` part."""

    def _projector_line(self, line: str) -> Allocation | None:
        """The projector's allocations (mtmd's own lines); they never start a new load."""
        m = _CLIP_BACKEND_RE.search(line)
        if m is not None:
            self._clip_backend = m["backend"]
            return None
        m = _CLIP_WEIGHTS_RE.search(line)
        buffer = self._clip_backend
        if m is None:
            m = _CLIP_COMPUTE_RE.search(line)
            if m is None:
                return None
            buffer = m["buffer"]
        alloc = Allocation(
            device=buffer_device(buffer, self.gpu_keys),
            buffer=buffer,
            part="projector",
            bytes=round(float(m["mib"]) * _MIB),
        )
        self.allocations.append(alloc)
        return alloc

    def feed(self, line: str) -> Allocation | None:
        if "CLIP using" in line or "load_hparams: model size" in line or "reserve_compute_meta" in line:
            return self._projector_line(line)
        if _DRAFT_LOAD in line:
            self._draft = True
            return None
        alloc = parse_allocation_line(line, self.gpu_keys)
        if alloc is None:
            return None
        if self._draft:
            alloc = Allocation(alloc.device, alloc.buffer, "draft", alloc.bytes)
        elif alloc.part == "weights" and self._after_weights:
            self.allocations.clear()
            self._after_weights = False
        elif alloc.part != "weights":
            self._after_weights = True
        self.allocations.append(alloc)
        return alloc

    def feed_all(self, lines: Sequence[str]) -> AllocationLedger:
        for line in lines:
            self.feed(line)
        return self

    def __bool__(self) -> bool:
        return bool(self.allocations)

    def by_device(self) -> dict[str, dict[Part, int]]:
        """Device → part → bytes."""
        out: dict[str, dict[Part, int]] = {}
        for a in self.allocations:
            parts = out.setdefault(a.device, {})
            parts[a.part] = parts.get(a.part, 0) + a.bytes
        return out

    def device_totals(self) -> dict[str, int]:
        return {dev: sum(parts.values()) for dev, parts in self.by_device().items()}

    def part_totals(self) -> dict[Part, int]:
        out: dict[Part, int] = {}
        for a in self.allocations:
            out[a.part] = out.get(a.part, 0) + a.bytes
        return out

    @property
    def total_bytes(self) -> int:
        return sum(a.bytes for a in self.allocations)

    def to_json(self) -> dict[str, object]:
        return {
            "total_bytes": self.total_bytes,
            "by_device": {
                dev: {**parts, "total_bytes": sum(parts.values())} for dev, parts in self.by_device().items()
            },
        }
